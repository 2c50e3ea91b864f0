"""Integrations of shardwise with training frameworks that own the training loop.

    from shardwise.integrations.transformers import ShardwiseTrainer   # transformers.Trainer, on shardwise

Each integration is a module of its own, imported on demand: importing ``shardwise`` (or this
package) never imports the framework.
"""
