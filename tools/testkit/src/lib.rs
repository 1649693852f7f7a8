//! What the benchmark (`tools/bench`) and the chaos suite (`tools/chaos`)
//! share: both drive a real `deductor` against a real broker and Redis.

pub mod topics;
