"""SOAP-BPNN as an atomtrain architecture (metatrain's ``soap_bpnn``). Its model, and
with it sphericart's library, is imported when first built: an exported model lists
every torch extension loaded in the process, and another architecture's must not list
sphericart."""

ARCHITECTURE_NAME = "soap_bpnn"
