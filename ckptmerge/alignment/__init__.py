"""Structural alignment, pure: which source tensor feeds which target when the names differ.

Holds: ``align`` (evidence scoring and global assignment) and ``layouts`` (framework layouts such
as PyTorch's, as data).

May import: ``formats`` (specs and dtypes only) and the bottom modules.
"""
