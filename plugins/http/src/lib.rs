//! HTTP transport plugin of shardport (work in progress).
