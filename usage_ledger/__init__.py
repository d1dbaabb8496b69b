"""The composition root: the only package that knows every other one."""
