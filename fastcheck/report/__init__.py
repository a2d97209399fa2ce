"""The report: results, typed events, their text, the stored JSON, diagnoses."""
