//! The admission server: TLS, AdmissionReview routing and the rules.
