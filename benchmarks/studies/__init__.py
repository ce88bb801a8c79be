"""Studies run by hand, not by `./benchmarks/bench`: each file answers one question, prints its
figures and names, in its docstring, the doc that quotes them (benchmarks/README.md, "Files")."""
