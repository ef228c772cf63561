"""The embedded cluster's nsqlookupd double (stock and youzan flavours)."""

from smartnsq.devcluster.lookupd.admin import AdminError
from smartnsq.devcluster.lookupd.faulting import LOOKUPD_FAULT_KINDS, LookupdFault, LookupdFaultKind
from smartnsq.devcluster.lookupd.server import LookupdGroup, NsqLookupd

__all__ = [
    "LOOKUPD_FAULT_KINDS",
    "AdminError",
    "LookupdFault",
    "LookupdFaultKind",
    "LookupdGroup",
    "NsqLookupd",
]
