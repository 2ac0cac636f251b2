"""Leaving a process that used Gloo without the abort Note [Gloo threads at exit] describes.

Shared by bench/peer.py and the tests that run PyTorch beside Tandem (tests/fsdp/
fsdp2_mixed_precision.py): import this module, and torch.distributed.nn, before any process group;
free what holds the group, call end_process_group(), then exit through exit_without_gloo_threads.
"""
import gc
import os
import sys
import time

import torch
import torch.distributed.nn  # noqa: F401  before any process group: the Note below

# Note [Gloo threads at exit]
# The peer once failed one run in two under `ctest -j2` (issue 18): both ranks of an accelerate
# measurement aborted with "terminate called without an active exception" after writing their
# record. The core dump shows the crash in a Gloo worker thread (pt_gloo_runloop) during
# Py_FinalizeEx: it dropped the last reference to a finished barrier, whose prior all-gather held a
# tensor whose Python object the tensor owned; freeing it takes the GIL, a finalizing interpreter
# ends such a thread with pthread_exit, and the forced unwind through a noexcept destructor calls
# std::terminate. The thread was alive because the process group was never freed:
# torch.distributed.nn.functional binds `group=group.WORLD` as a default argument of ten functions,
# evaluated when the module is first imported. DDP's constructor imports it (through
# torch._dynamo); after init_process_group that pins the default group forever, so
# destroy_process_group leaves its threads running until exit, and under load the worker's
# release lags behind the main thread's exit. Imported before any process group exists, the
# defaults are None. torch.distributed.optim's ZeroRedundancyOptimizer (the zero1 peer) binds
# `group=dist.group.WORLD` the same way in a helper's defaults: it is imported early too. Every
# path then frees what holds the group (the DDP model, accelerate's
# prepared objects) before destroying it, and the exit checks that no Gloo thread is left.
# FSDP2 (torch 2.11) keeps the default group's Gloo threads alive after destroy_process_group even
# once its modules are freed (a plain init/destroy joins them): expected there, and left the same
# safe way, through os._exit, after flushing what the process printed.


def gloo_threads():
    """Gloo's worker threads alive in this process (by their name, pt_gloo_runloop)."""
    count = 0
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                count += f.read().strip() == "pt_gloo_runloop"
        except OSError:  # the thread ended meanwhile
            pass
    return count


def end_process_group():
    """Destroys the default process group; its last references must already be gone, so that
    its Gloo threads are joined now, while the interpreter is whole."""
    gc.collect()  # a DDP model in a reference cycle still holds the group
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    gc.collect()


def exit_without_gloo_threads(status, expected_holder=""):
    """Exits with STATUS. Should a Gloo thread still run, says so in one line (naming
    EXPECTED_HOLDER, e.g. "FSDP2", when one is known to keep them) and leaves without the
    interpreter's finalization, where such a thread can abort the process."""
    left = gloo_threads()
    for _ in range(20):  # a thread just joined may linger in /proc for a moment
        if not left:
            break
        time.sleep(0.05)
        left = gloo_threads()
    if left:
        program = os.path.basename(sys.argv[0])
        why = (f"still held by {expected_holder} after the process group's destruction" if expected_holder
               else "outlived destroy_process_group")
        sys.stderr.write(f"{program}: {left} Gloo worker thread(s) {why}; leaving through os._exit "
                         "(Note [Gloo threads at exit])\n")
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    sys.exit(status)
