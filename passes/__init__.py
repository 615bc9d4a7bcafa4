"""Compile-pipeline passes for dsa_ops: the decode backend rewrite and how to install it.

``passes`` imports ``dsa_ops``, never the reverse.
"""

from passes.indexer_topk import IndexerTopKPass, Rewrite, rewrite_graph, rewrite_topk
from passes.install import ComposedPass, compose, inductor_options, install

__all__ = ["IndexerTopKPass", "Rewrite", "rewrite_graph", "rewrite_topk", "ComposedPass", "compose",
           "inductor_options", "install"]
