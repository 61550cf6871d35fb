"""Shared fixtures. The integration service is one real ``cascade serve`` process per test session."""
