"""The stored outputs do not depend on the machine: the notebooks that train (09 onwards: the depth experiment, the
language model, the training runs, decoding from trained weights, and every later one) pass nbval at one thread and
at four, and with MKL's AVX2 kernels (MKL_CBWR=AVX2: the code path of a laptop whose CPU has no AVX-512).

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
# threads with MKL's compatible kernels 13 min 30 s on the 2-core VM), and again with its learning curve (four threads
# with AVX2's kernels, 6 min 18 s), which would double this test's time. Its fine-tune has to get cheaper before it
# joins (issue 40); run it by hand when its prints change. 16 (fast decoding) trains nothing: it prints bytes, counts,
# booleans and one loss per byte at three decimals, and times only into its figures; it takes about three minutes, so
# it is left out too: run it by hand when its prints change. On 2026-12-07 both runs caught a line that printed this
# machine's thread and core counts; with it fixed, both passed (2 min each, side by side, on the 2-core VM).
TOO_SLOW_HERE = {"15_finetune.ipynb", "16_fast_decode.ipynb"}
TRAINING_NOTEBOOKS = [path for path in sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))
                      if int(path.name[:2]) >= 9 and path.name not in TOO_SLOW_HERE]
# MKL's processor-independent kernels (MKL_CBWR=COMPATIBLE, an older CPU's code path) passed too, in every CI run up
# to 2026-11-29 (11 alone: 2 min against 1 with AVX2's), too slow for every run. Four threads on fewer cores wait for
# each other: OMP_WAIT_POLICY=PASSIVE lets a waiting thread sleep instead of spinning (the same sums, the same order).
MACHINES = {
    "one thread": {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"},
    "four threads, MKL's AVX2 kernels": {"OMP_NUM_THREADS": "4", "MKL_NUM_THREADS": "4", "MKL_CBWR": "AVX2",
                                         "OMP_WAIT_POLICY": "PASSIVE"},
}


def test_the_training_notebooks_are_found():
    assert [path.name[:2] for path in TRAINING_NOTEBOOKS][:4] == ["09", "10", "11", "12"]


STARTUP = """import os
import torch
torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, tuple[int, str]]:
    """nbval of the training notebooks on each machine: the runs side by side (one of them is one thread), each a
    fresh pytest process. Its exit status and the tail of what it printed, by machine."""
    started = {}
    for n, (machine, settings) in enumerate(MACHINES.items()):
        home = tmp_path_factory.mktemp(f"machine{n}")
        startup = home / "ipython" / "profile_default" / "startup"
        startup.mkdir(parents=True)
        (startup / "00-threads.py").write_text(STARTUP)
        log = (home / "nbval.log").open("w+")
        started[machine] = log, subprocess.Popen(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval", "--nbval-current-env",
             "--nbval-sanitize-with", str(REPO / "tests" / "nbval_sanitize.cfg"), *map(str, TRAINING_NOTEBOOKS)],
            cwd=REPO, env={**os.environ, **settings, "IPYTHONDIR": str(home / "ipython")}, stdout=log,
            stderr=subprocess.STDOUT, text=True)
    done = {}
    for machine, (log, process) in started.items():
        try:
            status = process.wait(timeout=1800)
        except subprocess.TimeoutExpired:
            process.kill()
            status = "timed out after 30 min"
        log.seek(0)
        done[machine] = status, log.read()[-6000:]
        log.close()
    return done


@pytest.mark.parametrize("machine", list(MACHINES))
def test_the_notebooks_that_train_print_the_same_on_another_machine(machine, runs):
    status, printed = runs[machine]
    assert status == 0, f"nbval with {MACHINES[machine]} ({status}):\n{printed}"
