"""Models: SOAP features, per-element networks, composition baseline, assembled potential."""

from .soap_bpnn import SoapBpnn

__all__ = ["SoapBpnn"]
