"""The kvevents test suite: one folder per package folder (tests/zeromq tests kvevents/zeromq, ...).

`tests` is a package so that every test module, in any folder, imports its shared pieces as
`tests.helpers.<module>`; pytest runs with `--import-mode=importlib` and the repository root on
`sys.path` (pyproject.toml), so the folders themselves need no `__init__.py`.
"""
