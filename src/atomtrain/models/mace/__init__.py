"""MACE (mace-torch's ScaleShiftMACE) as an atomtrain architecture: metatrain's
``experimental.mace``, and ``mace``. mace-torch is imported when a MACE model is first
built or loaded, never by runs of other architectures."""

ARCHITECTURE_NAME = "mace"
