//! Root package of the shardport workspace: owns `tests/` and `examples/`.
