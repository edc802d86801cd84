"""Scoring phrase pairs and rewriting phrase tables (score), in shards under torchrun (shard)."""
