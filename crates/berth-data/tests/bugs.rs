//! BUG-23, 24, 25, 27, 29, 30 of the behaviour cases.
