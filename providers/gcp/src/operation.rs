//! Reading Compute Engine's zonal `Operation` (what `instances.delete` returns): pure.

use google_cloud_compute_v1::model::Operation;
use google_cloud_compute_v1::model::operation::Status;

/// Where an operation stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress {
    /// PENDING or RUNNING: poll again.
    Running,
    /// DONE without error.
    Done,
    /// DONE with an error: the HTTP status Compute Engine reports for it, its error codes
    /// (e.g. `RESOURCE_NOT_READY`, `RESOURCE_OPERATION_RATE_EXCEEDED`) and its messages.
    Failed {
        status: Option<u16>,
        codes: Vec<String>,
        message: String,
    },
}

/// The state of `operation`.
pub fn progress(operation: &Operation) -> Progress {
    if operation.status != Some(Status::Done) {
        return Progress::Running;
    }
    let Some(error) = operation.error.as_ref().filter(|e| !e.errors.is_empty()) else {
        return Progress::Done;
    };
    let message = error
        .errors
        .iter()
        .map(|e| {
            format!(
                "{}: {}",
                e.code.as_deref().unwrap_or("UNKNOWN"),
                e.message.as_deref().unwrap_or("")
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    let codes = error.errors.iter().filter_map(|e| e.code.clone()).collect();
    Progress::Failed {
        codes,
        status: operation
            .http_error_status_code
            .and_then(|s| u16::try_from(s).ok()),
        message,
    }
}

/// Whether a failed deletion failed because the instance was already gone.
pub fn failed_as_not_found(status: Option<u16>, message: &str) -> bool {
    status == Some(404) || message.contains("RESOURCE_NOT_FOUND")
}

#[cfg(test)]
mod tests {
    use super::*;
    use google_cloud_compute_v1::model::operation::error::Errors;

    fn operation(status: Status) -> Operation {
        let mut operation = Operation::new();
        operation.status = Some(status);
        operation
    }

    #[test]
    fn running_until_done() {
        assert_eq!(progress(&operation(Status::Pending)), Progress::Running);
        assert_eq!(progress(&operation(Status::Running)), Progress::Running);
        assert_eq!(progress(&Operation::new()), Progress::Running);
        assert_eq!(progress(&operation(Status::Done)), Progress::Done);
    }

    #[test]
    fn a_done_operation_with_errors_failed() {
        let mut failed = operation(Status::Done);
        let mut error = google_cloud_compute_v1::model::operation::Error::new();
        let mut item = Errors::new();
        item.code = Some("RESOURCE_NOT_FOUND".into());
        item.message = Some("The resource 'x' was not found".into());
        error.errors.push(item);
        failed.error = Some(error);
        failed.http_error_status_code = Some(404);
        let Progress::Failed {
            status,
            codes,
            message,
        } = progress(&failed)
        else {
            panic!("expected a failure");
        };
        assert_eq!(status, Some(404));
        assert_eq!(codes, ["RESOURCE_NOT_FOUND"]);
        assert_eq!(
            message,
            "RESOURCE_NOT_FOUND: The resource 'x' was not found"
        );
        assert!(failed_as_not_found(status, &message));
        assert!(!failed_as_not_found(Some(400), "QUOTA_EXCEEDED: no"));
    }
}
