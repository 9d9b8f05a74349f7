"""Training recipes for specrt: a demo target model, a distilled draft model and
Medusa heads, trained from scratch on CPU on the Python standard library source.

Entry point: ``python -m specrt.recipes.train_demo --out specrt/assets/demo``.
"""
import os as _os

# On a shared CPU, busy-waiting OpenMP threads slow training down several times
# (measured 4x with one other busy process on 2 cores).  This only takes effect
# if torch has not been imported yet; export OMP_WAIT_POLICY=PASSIVE to be sure.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
