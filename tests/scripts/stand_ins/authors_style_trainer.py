# A stand-in for one of the MARS authors' trainers: prints their log lines for a few fixed losses.
import sys

STEP_OFFSET = 0.0
for arg in sys.argv[1:]:
    if arg.startswith("--offset="):
        STEP_OFFSET = float(arg.split("=", 1)[1])
for step in range(4):
    if step % 2 == 0:
        print(f"step {step}: train loss {5.0 - step:.4f}, val loss {5.5 - step + STEP_OFFSET:.4f}")
    print(f"iter {step}: loss {5.0 - step + (STEP_OFFSET if step >= 2 else 0.0):.4f}, time 1.00ms, mfu -100.00%")
