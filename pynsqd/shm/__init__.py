"""Message storage outside the process heap: shared-memory rings and the disk files they
spill to (segmented, crash-safe queue files in go-diskqueue's format)."""
