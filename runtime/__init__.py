"""Pipeline stage 4 of 4 (`dyntvm.pipeline`), and all a deployed artifact needs: it imports only the IR.

`model.py` (CompiledModel, input checks) runs a partitioned graph with `executor.py` (compiled regions
through the TVM VM, control-flow and dynamic-shape nodes from Python); `kernels.py` holds the numpy
kernel of every op, `interpreter.py` the reference interpreter over them; `fold.py` is the constant
folding pass the pipeline runs after partitioning; `artifact.py` writes and checks artifact files and
`load.py` is `dt.load`. Nothing is imported here, so `import dyntvm.runtime.load` stays light.
"""
