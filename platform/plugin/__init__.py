"""The platform's TCG plugin (C): its sources, its build, and a reader of its counters."""
