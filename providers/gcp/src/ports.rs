//! The deletion engine's ports on Compute Engine: `instances.get` as the lookup,
//! `instances.delete` as the request, `zoneOperations.get` of this process's own pending delete
//! while the instance is still shown. Each translates the cloud's answer and nothing more: the
//! engine (`peerpods_provider_core::Deleter`) decides what "deleted" means.
//!
//! - A 404 of `instances.get` is [`Sighting::NotFound`]; a 404 of `instances.delete`, or an
//!   operation that ended "not found", is [`DeleteAnswer::NotFound`]: neither proves anything.
//! - `resourceNotReady` (another operation holds the instance), answered to the DELETE or as the
//!   end of its operation, is [`DeleteAnswer::WrongState`] or a [`Sighting::Present`] instance.
//! - `STOPPING` and `TERMINATED` are no deletion states on Compute Engine (a stopped VM is
//!   `TERMINATED`): an instance shown is [`Sighting::Deleting`] only while a delete operation
//!   this process started is pending, else [`Sighting::Present`].
//! - Parts: none. The boot disk cloud-api-adaptor creates is `autoDelete` and its ephemeral
//!   external address and Resource Manager tag bindings belong to the instance: Compute Engine
//!   removes them in the instance's own delete operation. Any other disk is not the VM's and is
//!   never deleted.

use async_trait::async_trait;
use peerpods_provider_core::deletion::{DeleteAnswer, DeletionPorts, Lookup, Sighting};
use peerpods_provider_core::{Error, InstanceKey};

use crate::failure::Failure;
use crate::operation::{self, Progress};
use crate::provider::{GcpProvider, created_of, request_id};

/// What a `DONE` operation with an error means for the deletion.
enum Ended {
    /// The instance was not found when it ran.
    NotFound,
    /// Another operation held the instance: nothing was deleted.
    NotReady,
}

/// The failure of an operation that ended with an error: what it means for the deletion, or
/// the error it is (a refusal for rate is throttling, as an answer would be).
fn ended_with_error(
    status: Option<u16>,
    codes: Vec<String>,
    message: String,
    what: &str,
) -> Result<Ended, Error> {
    if operation::failed_as_not_found(status, &message) {
        return Ok(Ended::NotFound);
    }
    // The codes say what happened; the status alone would make a busy instance INTERNAL and a
    // rate refusal a missing permission.
    let failure = Failure {
        status: status.or(Some(500)),
        retry_after: None,
        reasons: codes,
        message: format!("the operation failed: {message}"),
        credentials: None,
        transport: None,
    };
    if failure.is_not_ready() {
        return Ok(Ended::NotReady);
    }
    Err(failure.into_error(what))
}

#[async_trait]
impl DeletionPorts for GcpProvider {
    async fn look_up(&self, instance: &InstanceKey) -> Result<Lookup, Error> {
        let name = instance.id();
        let instance = match self.compute.get_instance(name).await {
            Ok(instance) => instance,
            Err(failure) if failure.is_not_found() => {
                self.pending.ended(name);
                return Ok(Lookup::of(Sighting::NotFound));
            }
            Err(failure) => return Err(failure.into_error(&format!("reading instance {name}"))),
        };
        let created = created_of(&instance);
        let seen = |sighting| Ok(Lookup::created(sighting, created));
        let labels = instance.labels.into_iter().collect();
        let Some(operation) = self.pending.of(name) else {
            return seen(Sighting::Present(labels));
        };
        let what = format!("deleting instance {name}");
        let polled = self
            .compute
            .get_operation(&operation)
            .await
            .map_err(|failure| failure.into_error(&what))?;
        match operation::progress(&polled) {
            Progress::Running => seen(Sighting::Deleting(labels)),
            // Done: the instance is on its way out; a later lookup confirms it.
            Progress::Done => {
                self.pending.ended(name);
                seen(Sighting::Deleting(labels))
            }
            Progress::Failed {
                status,
                codes,
                message,
            } => {
                self.pending.ended(name);
                // Nothing was deleted: the instance is as the lookup shows it.
                ended_with_error(status, codes, message, &what)?;
                seen(Sighting::Present(labels))
            }
        }
    }

    async fn request_delete(&self, instance: &InstanceKey) -> Result<DeleteAnswer, Error> {
        let name = instance.id();
        let what = format!("deleting instance {name}");
        // A fresh requestId per request: an attempt the SDK repeats is the same request, and a
        // request after a failed operation is a new one (the old id would answer that failure).
        let started = match self.compute.delete_instance(name, &request_id()).await {
            Ok(started) => started,
            Err(failure) if failure.is_not_found() => return Ok(DeleteAnswer::NotFound),
            Err(failure) if failure.is_not_ready() => return Ok(DeleteAnswer::WrongState),
            Err(failure) => return Err(failure.into_error(&what)),
        };
        match operation::progress(&started) {
            Progress::Running => {
                match started.name {
                    Some(operation) => self.pending.started(name, operation),
                    None => {
                        return Err(Error::internal(format!(
                            "{what}: Compute Engine returned an operation without a name"
                        )));
                    }
                }
                Ok(DeleteAnswer::Accepted)
            }
            Progress::Done => Ok(DeleteAnswer::Accepted),
            Progress::Failed {
                status,
                codes,
                message,
            } => Ok(match ended_with_error(status, codes, message, &what)? {
                Ended::NotFound => DeleteAnswer::NotFound,
                Ended::NotReady => DeleteAnswer::WrongState,
            }),
        }
    }
}
