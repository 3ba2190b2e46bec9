"""`dyntvm.F`: every op and control-flow builder. Works eagerly on numpy arrays and while tracing."""
from .control_flow import case, cond, foreach, ifelse, while_loop  # noqa: F401
from .dim_asserts import assert_dims_equal  # noqa: F401
from .ops import *  # noqa: F401,F403
from .ops import all_ops_names  # noqa: F401
from .lists import (list_append, list_at, list_concat, list_empty, list_erase, list_insert, list_length,  # noqa: F401
                    list_stack, make_list, split_to_list)
