//! What a decode leaves behind and what reads it, knowing no terminal: the step-event schema
//! (events), trace files (file), the store every view reads, the per-step list (steps), the
//! texts positions add (detok), export tables, comparisons of two decodes, and synthetic traces
//! for tests.

pub mod compare;
pub mod detok;
pub mod events;
pub mod export;
pub mod file;
pub mod steps;
pub mod store;
pub mod synth;
