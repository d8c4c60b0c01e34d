"""The model DSL: symbolic graphs built from modules; building computes nothing."""

from surogate.dsl.graph import Dim, Graph, Node, Value
from surogate.dsl.ops import LoRASlice

__all__ = ["Dim", "Graph", "LoRASlice", "Node", "Value"]
