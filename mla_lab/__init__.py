"""MLA Lab: support code for the course (problem, layout, build, check, bench, grade)."""
