"""Jupyter configuration for `make lab` (``jupyter lab --config=<this file>``); not a module to import.

* A save from JupyterLab (by hand or autosave) writes exactly the clean file the repo holds: the
  server cleans every notebook before writing it (`tidy.pre_save_hook`: no Python version, no widget
  state, blank widget model ids, merged printed outputs), so opening a notebook and saving it leaves
  ``git status`` clean, and reopening it never shows "Error displaying widget: model not found".
* A notebook opens unchanged: no unsaved-changes dot on its tab until the learner edits or runs it. The
  server serves each notebook with its kernel's Python version, which the saved files leave out and JupyterLab
  would otherwise write into the notebook as soon as the kernel starts (`tidy.ContentsManager`).
* The printed (and opened) URL opens notebook 01, and only it: every start begins with an empty workspace
  (JupyterLab's open tabs and layout, in a temporary folder removed when the server stops), so no tab and no
  kernel of an earlier session comes back beside the notebook the URL opens.
* nbgrader is installed for ``make student`` (its ClearSolutions preprocessor) only; its server and lab
  extensions (the Nbgrader and Formgrader menus, assignment lists, a course directory) are turned off.
"""

import atexit
import shutil
import tempfile

c = get_config()  # noqa: F821  (Jupyter runs this file with get_config defined)

c.ServerApp.contents_manager_class = "transformer_from_scratch.nbtools.tidy.ContentsManager"
c.ContentsManager.pre_save_hook = "transformer_from_scratch.nbtools.tidy.pre_save_hook"

# JupyterLab restores the tabs of the last session from its workspaces folder (~/.jupyter/lab/workspaces),
# each restored notebook starting a kernel: this server's workspaces live in a folder of its own, for its lifetime.
c.LabApp.workspaces_dir = tempfile.mkdtemp(prefix="transformer-from-scratch-workspaces-")
atexit.register(shutil.rmtree, c.LabApp.workspaces_dir, ignore_errors=True)

# `jupyter lab` prints and opens its default URL (with the token); `/` redirects there too.
c.ServerApp.default_url = c.LabApp.default_url = "/lab/tree/notebooks/01_linear.ipynb"

NBGRADER_SERVER_EXTENSIONS = ["formgrader", "validate_assignment", "assignment_list", "course_list"]
c.ServerApp.jpserver_extensions = {f"nbgrader.server_extensions.{name}": False
                                   for name in NBGRADER_SERVER_EXTENSIONS}


# Also off: the "Would you like to get notified about official Jupyter news?" pop-up, which asks a new
# learner to decide something unrelated to the course (and would fetch news from the internet).
DISABLED_IN_THE_LAB = ["@jupyter/nbgrader", "@jupyterlab/apputils-extension:announcements"]


def _without_distractions(handler, page_config):
    """Disable nbgrader's lab extension (all its plugins) and the news pop-up in the pages the server renders."""
    page_config["disabledExtensions"] = list(page_config.get("disabledExtensions", [])) + DISABLED_IN_THE_LAB
    return page_config


c.ServerApp.tornado_settings = {"page_config_hook": _without_distractions}
