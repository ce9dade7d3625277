"""The `kernels` package's own test suites (0.17.2 and 0.19.1), run against kerneld (issue 26's
conformance check, issue 40's honest measure).

`suite.py` fetches each release's suite from its sdist on the package registry (never copied
into this repository) and builds the release's clean venvs, `standins.py` builds the Hub repos
the tests name, `harness.py` runs a suite plain, through the start-up hook and on kerneld's API
under every public name (`api_as_kernels.py`), and fails on any test that passes plainly but not
through kerneld, unless docs/kernels-compatibility.md lists it with the reason.
`test_kernels_suite.py` (0.17.2) and `test_kernels_suite_0191.py` (0.19.1) run one release each.
"""
