"""Commands of later issues register here (demo, bench, serve, distill-draft, train-medusa)."""
