//! GetCapacity in domain terms: what the controllers read of a cloud's room for peer-pod VMs, without the
//! protobuf types (the gRPC layer converts, the domain never sees prost types).

use peerpods_proto::v1::GetCapacityResponse;

/// One figure a cloud reports: its limit and how much of it is in use, each only if the cloud can tell.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Figure {
    pub limit: Option<u64>,
    pub in_use: Option<u64>,
}

impl Figure {
    /// What is left: the limit minus what is in use (zero, not an underflow, past a quota); `None` unless
    /// both are known.
    pub fn free(self) -> Option<u64> {
        Some(self.limit?.saturating_sub(self.in_use?))
    }
}

/// A cloud's room for peer-pod VMs, as provider-service reports it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Capacity {
    pub instances: Figure,
    pub vcpus: Figure,
    pub memory_mib: Figure,
}

impl From<GetCapacityResponse> for Capacity {
    fn from(answer: GetCapacityResponse) -> Self {
        let figure = |f: Option<peerpods_proto::v1::Figure>| {
            f.map(|f| Figure {
                limit: f.limit,
                in_use: f.in_use,
            })
            .unwrap_or_default()
        };
        Capacity {
            instances: figure(answer.instances),
            vcpus: figure(answer.vcpus),
            memory_mib: figure(answer.memory_mib),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unreported_figure_is_unknown_and_a_reported_one_keeps_its_parts() {
        let answer = GetCapacityResponse {
            instances: Some(peerpods_proto::v1::Figure {
                limit: Some(10),
                in_use: Some(3),
            }),
            vcpus: None,
            memory_mib: Some(peerpods_proto::v1::Figure {
                limit: None,
                in_use: Some(1),
            }),
        };
        let capacity = Capacity::from(answer);
        assert_eq!(capacity.instances.free(), Some(7));
        assert_eq!(capacity.vcpus, Figure::default());
        assert_eq!(capacity.vcpus.free(), None);
        assert_eq!(capacity.memory_mib.free(), None);
        assert_eq!(
            Figure {
                limit: Some(5),
                in_use: Some(9)
            }
            .free(),
            Some(0)
        );
    }
}
