//! Security against the real daemon.
