"""Which threads of a process take SIGINT / SIGTERM (tests/trainer_test.py,
tests/serve_test.py): in `cllm train` and `cllm serve` only the thread
"cllm-signals" may, since a handler run on a thread inside a oneDNN kernel
writes its frame over the heap.
"""
import os
import signal


def stop_signal_takers(pid):
    """[(tid, thread name)] of pid's threads whose SigBlk lets SIGINT or SIGTERM through."""
    bits = (1 << (signal.SIGINT - 1)) | (1 << (signal.SIGTERM - 1))
    out = []
    for tid in sorted(os.listdir(f"/proc/{pid}/task"), key=int):
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                st = dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
        except OSError:
            continue  # the thread ended
        if int(st["SigBlk"], 16) & bits != bits:
            out.append((int(tid), st.get("Name", "?")))
    return out
