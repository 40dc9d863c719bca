"""Small helpers at the bottom of the import graph: errors, device and precision, progress, the places
commands write to."""
