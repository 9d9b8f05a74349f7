"""Training recipes for specrt: a demo target model, a distilled draft model and
Medusa heads, trained from scratch on CPU on the Python standard library source.

Entry point: ``python -m specrt.recipes.train_demo --out specrt/assets/demo``.
"""
