//! The real peers, built from their Go modules (`e2e/peers/`), run as processes against the local
//! control plane on demand: a test asks its [`crate::Env`] for the peers it needs.

pub mod kapp_controller;

pub use kapp_controller::KappController;
