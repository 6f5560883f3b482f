//! CA and serving certificate issue and rotation, shared by the webhook and the controller.
