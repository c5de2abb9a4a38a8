"""The stored outputs do not depend on the machine: the notebooks that train (09 onwards: the depth experiment, the
language model, the training runs, decoding from trained weights, and every later one) pass nbval at one thread and
at four, and with MKL's processor-independent kernels (MKL_CBWR=COMPATIBLE, the code path of an older CPU).

`make test` runs every notebook at the machine's defaults; a learner's laptop has another core count and another
processor, and a float32 sum in another order changes the last bits, which training amplifies (CONTRIBUTING.md,
*Rules for stored outputs*). Each run is a fresh pytest process, since MKL's kernels are chosen when torch loads. The
thread count is set in each kernel by an IPython startup file: torch caps OMP_NUM_THREADS at the number of cores, and
four threads must be four on a 2-core machine too."""

import os
import subprocess
import sys

import pytest

from transformer_from_scratch._project import repo_root

REPO = repo_root()
# 15 (LoRA on SmolLM2) is left out for now: it passed both runs by hand on 2026-11-29 (one thread 6 min 17 s; four
# threads with MKL's compatible kernels 13 min 30 s on the 2-core VM), which would double this test's time. Its
# fine-tune has to get cheaper before it joins (issue 40).
TOO_SLOW_HERE = {"15_finetune.ipynb"}
TRAINING_NOTEBOOKS = [path for path in sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))
                      if int(path.name[:2]) >= 9 and path.name not in TOO_SLOW_HERE]
MACHINES = {
    "one thread": {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"},
    "four threads, MKL's compatible kernels": {"OMP_NUM_THREADS": "4", "MKL_NUM_THREADS": "4", "MKL_CBWR": "COMPATIBLE"},
}


def test_the_training_notebooks_are_found():
    assert [path.name[:2] for path in TRAINING_NOTEBOOKS][:4] == ["09", "10", "11", "12"]


STARTUP = """import os
import torch
torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
"""


@pytest.mark.parametrize("machine", list(MACHINES))
def test_the_notebooks_that_train_print_the_same_on_another_machine(machine, tmp_path):
    startup = tmp_path / "ipython" / "profile_default" / "startup"
    startup.mkdir(parents=True)
    (startup / "00-threads.py").write_text(STARTUP)
    env = {**os.environ, **MACHINES[machine], "IPYTHONDIR": str(tmp_path / "ipython")}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval", "--nbval-current-env",
         "--nbval-sanitize-with", str(REPO / "tests" / "nbval_sanitize.cfg"), *map(str, TRAINING_NOTEBOOKS)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, f"nbval with {MACHINES[machine]}:\n{done.stdout[-6000:]}"
