//! End-to-end tests through the test engine (see tests/).
