"""Request placement: filters, scorers and pickers."""
