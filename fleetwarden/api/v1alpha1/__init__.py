"""fleetwarden.dev/v1alpha1: the RegionPool, ModelDeployment and TenantPolicy kinds."""

from fleetwarden.api.v1alpha1.common import (
    API_VERSION,
    GROUP,
    VERSION,
    Condition,
    ConditionStatus,
    LabelSelector,
    Toleration,
)
from fleetwarden.api.v1alpha1.modeldeployment import (
    ModelDeployment,
    ModelDeploymentSpec,
    ModelDeploymentStatus,
    RegionPlacement,
    RegionStatus,
)
from fleetwarden.api.v1alpha1.regionpool import (
    ModelAllocation,
    RegionPool,
    RegionPoolSpec,
    RegionPoolStatus,
)
from fleetwarden.api.v1alpha1.tenantpolicy import (
    TenantPolicy,
    TenantPolicySpec,
    TenantPolicyStatus,
)

__all__ = [
    "API_VERSION",
    "GROUP",
    "VERSION",
    "Condition",
    "ConditionStatus",
    "LabelSelector",
    "ModelAllocation",
    "ModelDeployment",
    "ModelDeploymentSpec",
    "ModelDeploymentStatus",
    "RegionPlacement",
    "RegionPool",
    "RegionPoolSpec",
    "RegionPoolStatus",
    "RegionStatus",
    "TenantPolicy",
    "TenantPolicySpec",
    "TenantPolicyStatus",
    "Toleration",
]
