"""Turning records into something a person reads: terminal tables now, full reports later."""
