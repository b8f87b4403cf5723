"""Pure planning of the next attempt: which checkpoint, which directives, which skip list."""
