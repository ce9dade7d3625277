"""The `kernels` package's own test suite, run against kerneld (issue 26's conformance check).

`suite.py` fetches the suite from the `kernels` sdist on the package registry (never copied into
this repository), `standins.py` builds the Hub repos its tests name, `test_kernels_suite.py`
runs it as plain `kernels` and through the start-up hook, and fails on any test that passes
plainly but not through kerneld, unless docs/kernels-compatibility.md lists it with the reason.
"""
