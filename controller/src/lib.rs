//! The reconcilers: pin refresher and catch-up, fast finalizer, leader election.
