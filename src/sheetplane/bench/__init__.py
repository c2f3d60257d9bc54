"""Benchmarks, in the package so ``sheetplane bench NAME`` runs them anywhere."""
