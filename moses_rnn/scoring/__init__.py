"""Scoring phrase pairs (scorer, bf16) and rewriting phrase tables (table: window by window, over worker
processes in pool, in torchrun shards in shard); rescoring n-best lists (nbest)."""
