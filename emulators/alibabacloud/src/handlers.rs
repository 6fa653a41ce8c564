//! The RPC endpoint: authentication, injected faults, then one function per action. Answers
//! start from the API reference examples in `fixtures/`.

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use serde_json::{Value, json};

use test_support::faults::{CallKind, Fault};

use crate::account::{ACCESS_KEY_ID, OIDC_PROVIDER_ARN, REGION, ROLE_ARN};
use crate::signature::{expected_signature, parse_authorization, query_params, sha256_hex};
use crate::state::State as Account;

const DESCRIBE_INSTANCES: &str = include_str!("../fixtures/describe_instances.json");
const DELETE_INSTANCE: &str = include_str!("../fixtures/delete_instance.json");
const ACCOUNT_ATTRIBUTES: &str = include_str!("../fixtures/describe_account_attributes.json");
const DESCRIBE_EIPS: &str = include_str!("../fixtures/describe_eip_addresses.json");
const UNASSOCIATE_EIP: &str = include_str!("../fixtures/unassociate_eip_address.json");
const RELEASE_EIP: &str = include_str!("../fixtures/release_eip_address.json");
const TAG_RESOURCES: &str = include_str!("../fixtures/tag_resources.json");
const ASSUME_ROLE_WITH_OIDC: &str = include_str!("../fixtures/assume_role_with_oidc.json");
const ERROR: &str = include_str!("../fixtures/error.json");

const ECS_VERSION: &str = "2014-05-26";
const VPC_VERSION: &str = "2016-04-28";
const STS_VERSION: &str = "2015-04-01";
/// `DurationSeconds` when the request leaves it out (the API reference's default).
const DEFAULT_KEY_LIFETIME: std::time::Duration = std::time::Duration::from_secs(3600);
const USED_VCPUS: &str = "used-postpaid-instance-vcpu-count";
const INCORRECT_STATUS: &str =
    "The current status of the resource does not support this operation.";

type Shared = Arc<Mutex<Account>>;

pub fn router(state: Shared) -> Router {
    Router::new().route("/", any(handle)).with_state(state)
}

fn fixture(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or(Value::Null)
}

fn request_id(account: &Account) -> String {
    format!("4EC47282-1B74-4534-BD0E-{:012X}", account.requests.len())
}

fn answer(status: StatusCode, body: Value, extra: &[(&'static str, String)]) -> Response {
    let mut response = (status, body.to_string()).into_response();
    let headers = response.headers_mut();
    headers.insert(
        "content-type",
        axum::http::HeaderValue::from_static("application/json;charset=utf-8"),
    );
    for (name, value) in extra {
        if let Ok(value) = axum::http::HeaderValue::from_str(value) {
            headers.insert(*name, value);
        }
    }
    response
}

/// A failure of the server with `status`: 503 as ECS's temporary failure, any other as its
/// internal error.
fn server_failure(account: &Account, status: u16) -> Response {
    if status == 503 {
        error(
            account,
            503,
            "ServiceUnavailable",
            "The request has failed due to a temporary failure of the server.",
        )
    } else {
        error(
            account,
            status,
            "InternalError",
            "The request processing has failed due to some unknown error, exception or failure.",
        )
    }
}

/// An error in the shape of the API reference: `RequestId`, `HostId`, `Code`, `Message`,
/// `Recommend`.
fn error(account: &Account, status: u16, code: &str, message: &str) -> Response {
    let mut body = fixture(ERROR);
    body["RequestId"] = json!(request_id(account));
    body["Code"] = json!(code);
    body["Message"] = json!(message);
    body["Recommend"] = json!(format!(
        "https://api.aliyun.com/troubleshoot?q={code}&product=Ecs"
    ));
    answer(
        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        body,
        &[],
    )
}

fn ok(account: &Account, mut body: Value) -> Response {
    body["RequestId"] = json!(request_id(account));
    answer(StatusCode::OK, body, &[])
}

async fn handle(
    State(state): State<Shared>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    // The fault layer first (its latency and hangs outside the lock).
    let faults = Arc::clone(&state.lock().unwrap_or_else(|p| p.into_inner()).faults);
    let fault = faults.before_request().await;
    let mut account = state.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(polls) = faults.operation_polls() {
        account.release_polls = polls;
    }
    serve(
        &mut account,
        fault,
        method.as_str(),
        uri.query().unwrap_or(""),
        &headers,
        &body,
    )
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

fn serve(
    account: &mut Account,
    fault: Fault,
    method: &str,
    query: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> Response {
    let action = header(headers, "x-acs-action")
        .unwrap_or_default()
        .to_owned();
    account.requests.push(action.clone());
    let params = query_params(query);
    // STS's parameters may travel form-encoded in the body (what Alibaba's SDKs do).
    let sts_form = if action == "AssumeRoleWithOIDC" {
        query_params(&String::from_utf8_lossy(body))
    } else {
        Vec::new()
    };
    account.params.push((
        action.clone(),
        params.iter().chain(&sts_form).cloned().collect(),
    ));

    let throttled_now = fault == Fault::Throttled;
    if throttled_now || account.throttle.0 > 0 {
        if !throttled_now {
            account.throttle.0 -= 1;
        }
        let retry_after = if throttled_now { 1 } else { account.throttle.1 };
        let mut response = error(
            account,
            429,
            "Throttling.User",
            "Request was denied due to user flow control.",
        );
        if let Ok(value) = axum::http::HeaderValue::from_str(&retry_after.to_string()) {
            response.headers_mut().insert("retry-after", value);
        }
        return response;
    }
    let failed_now = matches!(fault, Fault::ServerError | Fault::Hang(_));
    if failed_now || account.fail.0 > 0 {
        let status = if failed_now {
            503
        } else {
            account.fail.0 -= 1;
            account.fail.1
        };
        return server_failure(account, status);
    }

    // A failure of one action only (e.g. `ReleaseEipAddress` after `UnassociateEipAddress`
    // succeeded), answered as the general failures above.
    if let Some((left, status)) = account.fail_action.get_mut(&action)
        && *left > 0
    {
        *left -= 1;
        let status = *status;
        return server_failure(account, status);
    }

    // A documented "try again later" answer of one action.
    if let Some((left, refusal)) = account.refuse_action.get_mut(&action)
        && *left > 0
    {
        *left -= 1;
        let (status, code, message, retry_after) = refusal.answer();
        let mut response = error(account, status, code, message);
        if let Some(secs) = retry_after
            && let Ok(value) = axum::http::HeaderValue::from_str(&secs.to_string())
        {
            response.headers_mut().insert("retry-after", value);
        }
        return response;
    }

    // Anonymous: STS authenticates the OIDC token, not a signature.
    if action == "AssumeRoleWithOIDC" {
        if header(headers, "x-acs-version") != Some(STS_VERSION) {
            return error(
                account,
                400,
                "InvalidVersion",
                "Specified parameter Version is not valid.",
            );
        }
        let all: Vec<(String, String)> = params.iter().chain(&sts_form).cloned().collect();
        return assume_role_with_oidc(account, &all);
    }
    if let Some(response) = authenticate(account, method, &params, headers, body) {
        return response;
    }
    let version = header(headers, "x-acs-version").unwrap_or_default();
    let wanted = match action.as_str() {
        "DescribeInstances" | "DeleteInstance" | "DescribeAccountAttributes" => ECS_VERSION,
        "DescribeEipAddresses" | "UnassociateEipAddress" | "ReleaseEipAddress" | "TagResources" => {
            VPC_VERSION
        }
        _ => {
            return error(
                account,
                404,
                "InvalidAction.NotFound",
                "Specified api is not found, please check your url and method.",
            );
        }
    };
    if version != wanted {
        return error(
            account,
            400,
            "InvalidVersion",
            "Specified parameter Version is not valid.",
        );
    }
    let get = |name: &str| {
        params
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    if get("RegionId").is_some_and(|r| r != REGION) {
        return error(
            account,
            404,
            "InvalidRegionId.NotFound",
            "The specified region does not exist.",
        );
    }
    if let Some(example) = account
        .verbatim
        .get_mut(&action)
        .and_then(|queue| queue.pop_front())
    {
        let mut response = (StatusCode::OK, example).into_response();
        response.headers_mut().insert(
            "content-type",
            axum::http::HeaderValue::from_static("application/json;charset=utf-8"),
        );
        return response;
    }
    match action.as_str() {
        "DescribeInstances" => describe_instances(account, &params),
        // An instance created moments ago may be unknown to a deletion (the fault layer's
        // visibility and flapping), whatever `DescribeInstances` lists.
        "DeleteInstance"
            if get("InstanceId").is_some_and(|id| account.faults.hides(&id, CallKind::Delete)) =>
        {
            error(
                account,
                404,
                "InvalidInstanceId.NotFound",
                "The specified InstanceId does not exist.",
            )
        }
        "DeleteInstance" => delete_instance(account, get("InstanceId"), get("Force")),
        "DescribeAccountAttributes" => account_attributes(account, &params),
        "DescribeEipAddresses" => describe_eips(account, &get),
        "UnassociateEipAddress" => unassociate_eip(account, get("AllocationId")),
        "TagResources" => tag_resources(account, &params),
        _ => release_eip(account, get("AllocationId")),
    }
}

/// Checks the V3 signature as ECS does: the key id must exist, the signed headers must cover
/// `host` and every `x-acs-*` header, the body hash must match, and the signature must be the
/// one the secret gives. A nonce is accepted once. `Some` is the refusal.
fn authenticate(
    account: &mut Account,
    method: &str,
    params: &[(String, String)],
    headers: &HeaderMap,
    body: &[u8],
) -> Option<Response> {
    let incomplete = |account: &Account| {
        error(
            account,
            400,
            "IncompleteSignature",
            "The request signature does not conform to Aliyun standards.",
        )
    };
    let Some(auth) = header(headers, "authorization").and_then(parse_authorization) else {
        return Some(incomplete(account));
    };
    let secret = match key_secret(account, &auth.access_key_id, headers) {
        Ok(secret) => secret,
        Err((status, code, message)) => return Some(error(account, status, code, message)),
    };
    let mut required: Vec<String> = headers
        .keys()
        .map(|k| k.as_str().to_owned())
        .filter(|k| k.starts_with("x-acs-"))
        .collect();
    required.push("host".into());
    if required
        .iter()
        .any(|name| !auth.signed_headers.contains(name))
    {
        return Some(incomplete(account));
    }
    let mut signed = Vec::new();
    for name in &auth.signed_headers {
        let Some(value) = header(headers, name) else {
            return Some(incomplete(account));
        };
        signed.push((name.clone(), value.to_owned()));
    }
    let payload_hash = sha256_hex(body);
    let expected = expected_signature(method, params, &signed, &payload_hash, &secret);
    if header(headers, "x-acs-content-sha256") != Some(payload_hash.as_str())
        || expected != auth.signature
    {
        return Some(error(
            account,
            400,
            "SignatureDoesNotMatch",
            "Specified signature is not matched with our calculation.",
        ));
    }
    let nonce = header(headers, "x-acs-signature-nonce")
        .unwrap_or_default()
        .to_owned();
    if !account.nonces.insert(nonce) {
        return Some(error(
            account,
            400,
            "SignatureNonceUsed",
            "Specified signature nonce was used already.",
        ));
    }
    account.signers.push(auth.access_key_id);
    None
}

/// The secret of the key that signed: the static pair's, or a temporary key's, which counts
/// only with its own security token (`x-acs-security-token`) and until its `Expiration`, as the
/// gateway's common errors describe: 400 `MissingSecurityToken`, 400
/// `InvalidSecurityToken.MismatchWithAccessKey`, 400 `InvalidSecurityToken.Expired`.
fn key_secret(
    account: &Account,
    key_id: &str,
    headers: &HeaderMap,
) -> Result<String, (u16, &'static str, &'static str)> {
    if key_id == ACCESS_KEY_ID {
        return Ok(account.secret.clone());
    }
    let Some(key) = account.temporary.get(key_id) else {
        return Err((
            404,
            "InvalidAccessKeyId.NotFound",
            "Specified access key is not found.",
        ));
    };
    match header(headers, "x-acs-security-token") {
        None => Err((
            400,
            "MissingSecurityToken",
            "SecurityToken is mandatory for this action.",
        )),
        Some(token) if token != key.security_token => Err((
            400,
            "InvalidSecurityToken.MismatchWithAccessKey",
            "Specified SecurityToken mismatch with the AccessKey.",
        )),
        Some(_) if jiff::Timestamp::now() >= key.expires => Err((
            400,
            "InvalidSecurityToken.Expired",
            "Specified SecurityToken is expired.",
        )),
        Some(_) => Ok(key.secret.clone()),
    }
}

/// STS `AssumeRoleWithOIDC`: the OIDC provider must be the registered one, the token the one
/// the test wrote (a real STS verifies its signature against the provider's keys), the role
/// the one trusting that provider; then a temporary key, in the reference example's shape.
/// Refusals are STS's documented 401s.
fn assume_role_with_oidc(account: &mut Account, params: &[(String, String)]) -> Response {
    let get = |name: &str| {
        params
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
            .unwrap_or_default()
    };
    let refusal = if get("OIDCProviderArn") != OIDC_PROVIDER_ARN {
        Some((
            "AuthenticationFail.NoPermission",
            "No such OIDC Provider registered.",
        ))
    } else if get("OIDCToken").is_empty() {
        Some((
            "AuthenticationFail.OIDCToken.Invalid",
            "The OIDCToken can not empty.",
        ))
    } else if get("OIDCToken") != account.oidc_token {
        Some((
            "AuthenticationFail.OIDCToken.InvalidSignature",
            "OIDC token validate failed: invalid signature.",
        ))
    } else if get("RoleArn") != ROLE_ARN {
        Some(("AuthenticationFail.NoPermission", "There is no permission"))
    } else {
        None
    };
    if let Some((code, message)) = refusal {
        return sts_error(account, StatusCode::UNAUTHORIZED, code, message);
    }
    if !(2..=64).contains(&get("RoleSessionName").len()) {
        return sts_error(
            account,
            StatusCode::BAD_REQUEST,
            "InvalidParameter.RoleSessionName",
            "The parameter RoleSessionName is wrongly formed.",
        );
    }
    let lifetime = account.key_lifetime.unwrap_or_else(|| {
        get("DurationSeconds")
            .parse()
            .map(std::time::Duration::from_secs)
            .unwrap_or(DEFAULT_KEY_LIFETIME)
    });
    let id = account.issue_temporary_key(lifetime);
    let Some(key) = account.temporary.get(&id) else {
        return server_failure(account, 500);
    };
    let mut body = fixture(ASSUME_ROLE_WITH_OIDC);
    body["Credentials"] = json!({
        "AccessKeyId": id,
        "AccessKeySecret": key.secret,
        "SecurityToken": key.security_token,
        "Expiration": key.expires.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
    });
    body["AssumedRoleUser"]["Arn"] = json!(format!("{ROLE_ARN}/{}", get("RoleSessionName")));
    ok(account, body)
}

/// STS's error: the common shape, naming STS's host and product.
fn sts_error(account: &Account, status: StatusCode, code: &str, message: &str) -> Response {
    let mut body = fixture(ERROR);
    body["RequestId"] = json!(request_id(account));
    body["HostId"] = json!("sts.aliyuncs.com");
    body["Code"] = json!(code);
    body["Message"] = json!(message);
    body["Recommend"] = json!(format!(
        "https://api.aliyun.com/troubleshoot?q={code}&product=Sts"
    ));
    answer(status, body, &[])
}

fn describe_instances(account: &mut Account, params: &[(String, String)]) -> Response {
    // ECS releases asynchronously: an accepted deletion is listed a few more times.
    let mut finished = Vec::new();
    for (id, instance) in account.instances.iter_mut() {
        match instance.releasing {
            Some(0) => finished.push(id.clone()),
            Some(n) => instance.releasing = Some(n - 1),
            None => {}
        }
    }
    for id in finished {
        account.remove_instance(&id);
    }
    let get = |name: &str| {
        params
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    let ids: Option<Vec<String>> = match get("InstanceIds") {
        Some(text) => match serde_json::from_str(text) {
            Ok(ids) => Some(ids),
            Err(_) => {
                return error(
                    account,
                    400,
                    "InvalidInstanceIds.Malformed",
                    "The specified parameter InstanceIds is not valid.",
                );
            }
        },
        None => None,
    };
    let mut tags = Vec::new();
    for n in 1..=20 {
        if let Some(key) = get(&format!("Tag.{n}.Key")) {
            tags.push((
                key.to_owned(),
                get(&format!("Tag.{n}.Value")).map(str::to_owned),
            ));
        }
    }
    let page_size = max_results(get("MaxResults")).min(account.page_limit);
    let offset = match get("NextToken").map(token_offset) {
        Some(Some(offset)) => offset,
        Some(None) => {
            return error(
                account,
                400,
                "InvalidNextToken.Malformed",
                "The specified parameter NextToken is not valid.",
            );
        }
        None => 0,
    };
    let matching: Vec<&String> = account
        .instances
        .iter()
        .filter(|(id, _)| ids.as_ref().is_none_or(|ids| ids.contains(id)))
        // An instance created moments ago may be missing from the answer, whether asked for by
        // id or by tag (the fault layer's visibility and flapping of lists).
        .filter(|(id, _)| !account.faults.hides(id, CallKind::List))
        .filter(|(_, i)| {
            tags.iter().all(|(key, value)| {
                i.tags
                    .iter()
                    .any(|(k, v)| k == key && value.as_ref().is_none_or(|value| v == value))
            })
        })
        .map(|(id, _)| id)
        .collect();
    let template = fixture(DESCRIBE_INSTANCES);
    let item = template["Instances"]["Instance"][0].clone();
    let listed: Vec<Value> = matching
        .iter()
        .skip(offset)
        .take(page_size)
        .filter_map(|id| {
            let instance = account.instances.get(*id)?;
            let mut v = item.clone();
            v["InstanceId"] = json!(id);
            v["InstanceName"] = json!(instance.name);
            v["HostName"] = json!(instance.name);
            v["Status"] = json!(instance.status);
            v["CreationTime"] = json!(instance.created);
            v["StartTime"] = json!(instance.created);
            v["Cpu"] = json!(instance.vcpus);
            v["Memory"] = json!(instance.memory_mib);
            v["RegionId"] = json!(REGION);
            v["ZoneId"] = json!(format!("{REGION}-a"));
            v["Tags"] = json!({"Tag": instance.tags.iter().map(|(k, val)| json!({"TagKey": k, "TagValue": val})).collect::<Vec<_>>()});
            let mut nics = vec![json!({"Type": "Primary", "MacAddress": "00:16:3e:32:b4:01", "PrimaryIpAddress": "172.17.0.10", "NetworkInterfaceId": instance.primary_nic})];
            if let Some(nic) = &instance.addon_nic {
                nics.push(json!({"Type": "Secondary", "MacAddress": "00:16:3e:32:b4:02", "PrimaryIpAddress": "172.17.0.11", "NetworkInterfaceId": nic}));
            }
            v["NetworkInterfaces"] = json!({"NetworkInterface": nics});
            // No EIP is bound to the instance itself (cloud-api-adaptor binds it to the add-on NIC).
            v["EipAddress"] = json!({"IsSupportUnassociate": true, "InternetChargeType": "", "IpAddress": "", "Bandwidth": 0, "AllocationId": ""});
            Some(v)
        })
        .collect();
    let next = offset.saturating_add(listed.len());
    let mut body = template;
    body["TotalCount"] = json!(matching.len());
    body["PageSize"] = json!(page_size);
    body["PageNumber"] = json!(offset / page_size + 1);
    body["NextToken"] = json!(if next < matching.len() {
        format!("{next:032x}")
    } else {
        String::new()
    });
    body["Instances"] = json!({"Instance": listed});
    ok(account, body)
}

/// `MaxResults` as ECS reads it: absent or below 10 is 10, above 100 is 100.
fn max_results(value: Option<&str>) -> usize {
    value
        .and_then(|m| m.parse::<i64>().ok())
        .map_or(10, |m| m.clamp(10, 100))
        .try_into()
        .unwrap_or(10)
}

/// The offset a `NextToken` stands for. Tokens look like ECS's (32 lowercase hex digits) and
/// encode the offset of the next page; a token past the end gives an empty last page.
fn token_offset(token: &str) -> Option<usize> {
    let valid = token.len() == 32
        && token
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if !valid {
        return None;
    }
    let offset = u128::from_str_radix(token, 16).ok()?;
    Some(usize::try_from(offset).unwrap_or(usize::MAX))
}

fn delete_instance(account: &mut Account, id: Option<String>, force: Option<String>) -> Response {
    let Some(id) = id else {
        return error(
            account,
            400,
            "MissingInstanceId",
            "InstanceId is mandatory for this action.",
        );
    };
    let release_polls = account.release_polls;
    let Some(instance) = account.instances.get_mut(&id) else {
        return error(
            account,
            404,
            "InvalidInstanceId.NotFound",
            "The specified InstanceId does not exist.",
        );
    };
    let forced = force.as_deref() == Some("true");
    if instance.releasing.is_some() || (instance.status == "Running" && !forced) {
        return error(account, 403, "IncorrectInstanceStatus", INCORRECT_STATUS);
    }
    instance.status = "Stopping".into();
    instance.releasing = Some(release_polls);
    if release_polls == 0 {
        account.remove_instance(&id);
    }
    ok(account, fixture(DELETE_INSTANCE))
}

fn account_attributes(account: &Account, params: &[(String, String)]) -> Response {
    let wanted: Vec<&str> = params
        .iter()
        .filter(|(k, _)| k.starts_with("AttributeName."))
        .map(|(_, v)| v.as_str())
        .collect();
    let mut values: Vec<(String, String)> = account.attributes.clone();
    if !account.attributes.iter().any(|(n, _)| n == USED_VCPUS) {
        let used: u64 = account.instances.values().map(|i| i.vcpus).sum();
        values.push((USED_VCPUS.to_owned(), used.to_string()));
    }
    let template = fixture(ACCOUNT_ATTRIBUTES);
    let item = template["AccountAttributeItems"]["AccountAttributeItem"][0].clone();
    let items: Vec<Value> = values
        .iter()
        .filter(|(name, value)| {
            !value.is_empty() && (wanted.is_empty() || wanted.contains(&name.as_str()))
        })
        .map(|(name, value)| {
            let mut v = item.clone();
            v["AttributeName"] = json!(name);
            let mut value_item = v["AttributeValues"]["ValueItem"][0].clone();
            value_item["Value"] = json!(value);
            value_item["InstanceChargeType"] = json!("PostPaid");
            // Per zone, instance type, disk category or expiry only where the attribute is
            // (`ExpiredTime` is "returned only when the privilege has an expiration time").
            if let Some(fields) = value_item.as_object_mut() {
                for absent in ["ZoneId", "InstanceType", "DiskCategory", "ExpiredTime"] {
                    fields.remove(absent);
                }
            }
            v["AttributeValues"] = json!({"ValueItem": [value_item]});
            v
        })
        .collect();
    let mut body = template;
    body["AccountAttributeItems"] = json!({"AccountAttributeItem": items});
    ok(account, body)
}

fn describe_eips(account: &mut Account, get: &dyn Fn(&str) -> Option<String>) -> Response {
    for eip in account.eips.values_mut() {
        if eip.status == "Unassociating" {
            if eip.settling == 0 {
                eip.status = "Available".into();
            } else {
                eip.settling -= 1;
            }
        }
    }
    // Up to 50 allocation ids, comma-separated.
    let allocations: Option<Vec<String>> =
        get("AllocationId").map(|ids| ids.split(',').map(|id| id.trim().to_owned()).collect());
    // `AssociatedInstanceType` defaults to `EcsInstance`.
    let bound_kind = get("AssociatedInstanceType").unwrap_or_else(|| "EcsInstance".into());
    let bound_id = get("AssociatedInstanceId");
    // `Tag.N.Key` / `Tag.N.Value` (N 1-20): an EIP must carry every one given.
    let mut tags = Vec::new();
    for n in 1..=20 {
        if let Some(key) = get(&format!("Tag.{n}.Key")) {
            tags.push((key, get(&format!("Tag.{n}.Value"))));
        }
    }
    // `PageSize`: default 10, at most 100; `PageNumber` from 1.
    let page_size: usize = get("PageSize")
        .and_then(|p| p.parse().ok())
        .unwrap_or(10)
        .clamp(1, 100);
    let page_number: usize = get("PageNumber")
        .and_then(|p| p.parse().ok())
        .unwrap_or(1)
        .max(1);
    let template = fixture(DESCRIBE_EIPS);
    let item = template["EipAddresses"]["EipAddress"][0].clone();
    let matching: Vec<(&String, &crate::state::Eip)> = account
        .eips
        .iter()
        .filter(|(id, _)| allocations.as_ref().is_none_or(|a| a.contains(id)))
        .filter(|(_, eip)| {
            bound_id.as_ref().is_none_or(|wanted| {
                eip.bound_to
                    .as_ref()
                    .is_some_and(|(id, kind)| id == wanted && *kind == bound_kind)
            })
        })
        .filter(|(_, eip)| {
            tags.iter().all(|(key, value)| {
                eip.tags
                    .iter()
                    .any(|(k, v)| k == key && value.as_ref().is_none_or(|value| v == value))
            })
        })
        .collect();
    let total = matching.len();
    let listed: Vec<Value> = matching
        .into_iter()
        .skip((page_number - 1).saturating_mul(page_size))
        .take(page_size)
        .map(|(id, eip)| {
            let mut v = item.clone();
            v["AllocationId"] = json!(id);
            v["IpAddress"] = json!(eip.ip);
            v["Status"] = json!(eip.status);
            v["Description"] = json!(eip.description);
            v["Tags"] = json!({"Tag": eip.tags.iter().map(|(k, val)| json!({"Key": k, "Value": val})).collect::<Vec<_>>()});
            v["Name"] = json!("");
            v["RegionId"] = json!(REGION);
            v["InstanceRegionId"] = json!(REGION);
            let (bound, kind) = eip.bound_to.clone().unwrap_or_default();
            v["InstanceId"] = json!(bound);
            v["InstanceType"] = json!(kind);
            v
        })
        .collect();
    let mut body = template;
    body["TotalCount"] = json!(total);
    body["PageSize"] = json!(page_size);
    body["PageNumber"] = json!(page_number);
    body["EipAddresses"] = json!({"EipAddress": listed});
    ok(account, body)
}

fn unassociate_eip(account: &mut Account, allocation: Option<String>) -> Response {
    let Some(eip) = allocation.and_then(|a| account.eips.get_mut(&a)) else {
        return error(
            account,
            404,
            "InvalidAllocationId.NotFound",
            "Specified allocation ID is not found",
        );
    };
    if eip.status != "InUse" {
        return error(account, 400, "IncorrectEipStatus", INCORRECT_STATUS);
    }
    eip.status = "Unassociating".into();
    eip.bound_to = None;
    eip.settling = 1;
    ok(account, fixture(UNASSOCIATE_EIP))
}

/// VPC `TagResources` for EIPs: `ResourceType` `EIP` (any letter case), `ResourceId.N`,
/// `Tag.N.Key` / `Tag.N.Value`; a key already on the resource gets the new value.
fn tag_resources(account: &mut Account, params: &[(String, String)]) -> Response {
    let get = |name: &str| {
        params
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    if !get("ResourceType").is_some_and(|t| t.eq_ignore_ascii_case("EIP")) {
        return error(
            account,
            400,
            "InvalidResourceType.NotSupported",
            "The specified ResourceType is not supported.",
        );
    }
    let ids: Vec<String> = (1..=50)
        .filter_map(|n| get(&format!("ResourceId.{n}")))
        .collect();
    let tags: Vec<(String, String)> = (1..=20)
        .filter_map(|n| {
            let key = get(&format!("Tag.{n}.Key"))?;
            Some((key, get(&format!("Tag.{n}.Value")).unwrap_or_default()))
        })
        .collect();
    if ids.is_empty() || tags.is_empty() {
        return error(
            account,
            400,
            "MissingParameter",
            "ResourceId.N and Tag.N.Key are mandatory for this action.",
        );
    }
    if ids.iter().any(|id| !account.eips.contains_key(id)) {
        return error(
            account,
            404,
            "InvalidResourceId.NotFound",
            "The specified resource is not found.",
        );
    }
    for id in &ids {
        if let Some(eip) = account.eips.get_mut(id) {
            for (key, value) in &tags {
                eip.tags.retain(|(k, _)| k != key);
                eip.tags.push((key.clone(), value.clone()));
            }
        }
    }
    ok(account, fixture(TAG_RESOURCES))
}

fn release_eip(account: &mut Account, allocation: Option<String>) -> Response {
    let Some(id) = allocation.filter(|a| account.eips.contains_key(a)) else {
        return error(
            account,
            404,
            "InvalidAllocationId.NotFound",
            "Specified allocation ID is not found",
        );
    };
    if account
        .eips
        .get(&id)
        .is_some_and(|eip| eip.status != "Available")
    {
        return error(account, 400, "IncorrectEipStatus", INCORRECT_STATUS);
    }
    account.eips.remove(&id);
    ok(account, fixture(RELEASE_EIP))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_results_is_read_as_ecs_documents_it() {
        assert_eq!(max_results(None), 10);
        assert_eq!(max_results(Some("5")), 10);
        assert_eq!(max_results(Some("50")), 50);
        assert_eq!(max_results(Some("500")), 100);
        assert_eq!(max_results(Some("-1")), 10);
    }

    #[test]
    fn next_tokens_are_32_hex_digits() {
        assert_eq!(token_offset(&format!("{:032x}", 7)), Some(7));
        // The reference's example token: far past any emulated page.
        assert!(token_offset("caeba0bbb2be03f84eb48b699f0a4883").is_some_and(|o| o > 1_000_000));
        assert_eq!(token_offset("7"), None);
        assert_eq!(token_offset("CAEBA0BBB2BE03F84EB48B699F0A4883"), None);
    }

    fn eip_params(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn listed_eips(account: &mut Account, pairs: &[(&str, &str)]) -> Value {
        let params = eip_params(pairs);
        let get = |name: &str| {
            params
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        };
        let response = describe_eips(account, &get);
        let bytes = body_bytes(response);
        serde_json::from_slice(&bytes).unwrap_or(Value::Null)
    }

    fn body_bytes(response: Response) -> Vec<u8> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        runtime
            .block_on(axum::body::to_bytes(response.into_body(), usize::MAX))
            .map(|b| b.to_vec())
            .unwrap_or_default()
    }

    #[test]
    fn eips_are_filtered_by_the_associated_type_defaulting_to_ecs_instance() {
        let mut account = Account::new("secret");
        let id = account.create_instance("pod", &[], true, 2, 4096);
        let nic = account
            .instances
            .get(&id)
            .and_then(|i| i.addon_nic.clone())
            .expect("add-on NIC");
        let by_nic = listed_eips(
            &mut account,
            &[
                ("AssociatedInstanceType", "NetworkInterface"),
                ("AssociatedInstanceId", nic.as_str()),
            ],
        );
        assert_eq!(by_nic["TotalCount"], json!(1));
        // Without the type, ECS looks for an EIP bound to an ECS instance of that id.
        let untyped = listed_eips(&mut account, &[("AssociatedInstanceId", nic.as_str())]);
        assert_eq!(untyped["TotalCount"], json!(0));
    }

    #[test]
    fn eips_come_in_pages_of_ten_by_default() {
        let mut account = Account::new("secret");
        let id = account.create_instance("pod", &[], true, 2, 4096);
        for _ in 0..11 {
            account.add_eip(&id);
        }
        let first = listed_eips(&mut account, &[]);
        assert_eq!(first["TotalCount"], json!(12));
        assert_eq!(
            first["EipAddresses"]["EipAddress"].as_array().map(Vec::len),
            Some(10)
        );
        let second = listed_eips(&mut account, &[("PageNumber", "2")]);
        assert_eq!(
            second["EipAddresses"]["EipAddress"]
                .as_array()
                .map(Vec::len),
            Some(2)
        );
        let all = listed_eips(&mut account, &[("PageSize", "100")]);
        assert_eq!(
            all["EipAddresses"]["EipAddress"].as_array().map(Vec::len),
            Some(12)
        );
    }
}
