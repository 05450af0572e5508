"""A test-only dt plugin contributing one of each kind of thing dt-core installs."""
