# The worker's program: Compose starts it in the worker VM, with this directory at /worker.
import os
import time

print(f"hello from worker VM {os.environ.get('III_WORKER_VM_ID', '?')}", flush=True)
time.sleep(1)  # a worker serves for a while; the example's caller sees it running
