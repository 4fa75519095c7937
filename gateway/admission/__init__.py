"""Admission: resolve the model, classify the request, estimate its size, build the scheduler's view."""
