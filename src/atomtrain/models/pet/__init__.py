"""PET (metatrain's ``PETBackend``) as an atomtrain architecture: metatrain's ``pet``.
metatrain's network modules are imported when a PET model is first built or loaded,
never by runs of other architectures, and never metatrain's trainer or data code."""

ARCHITECTURE_NAME = "pet"
