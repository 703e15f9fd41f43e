//! The protos' compatibility with their releases: the current protos against the newest release
//! under `proto/releases/` (the CI check), the release of the workspace's own version recorded,
//! and the checker seen failing on deliberately broken copies of a release (and passing on
//! additions and on retirements the proto way, by `reserved`).

use std::path::{Path, PathBuf};

use poolgate_proto::compat::{self, BreakingChange, Change};
use poolgate_proto::release::{self, ReleaseError, ReleaseTag};
use prost::Message;
use prost_types::descriptor_proto::ReservedRange;
use prost_types::enum_descriptor_proto::EnumReservedRange;
use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::{
    DescriptorProto, EnumDescriptorProto, EnumValueDescriptorProto, FieldDescriptorProto,
    FileDescriptorProto, FileDescriptorSet, MethodDescriptorProto, OneofDescriptorProto,
    ServiceDescriptorProto,
};

fn releases_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("releases")
}

/// The first release's descriptor set, the base every broken copy is made from.
fn v0_1_0() -> FileDescriptorSet {
    let tag = ReleaseTag::parse("v0.1.0").expect("a valid tag");
    release::read_release(&releases_dir(), tag).expect("the v0.1.0 release is recorded")
}

/// The changes the checker reports from the release to `new`, as their messages.
fn reported(old: &FileDescriptorSet, new: &FileDescriptorSet) -> Vec<String> {
    compat::breaking_changes(old, new)
        .iter()
        .map(BreakingChange::to_string)
        .collect()
}

/// Asserts that breaking `v0.1.0` with `break_it` is reported as exactly `expected`.
fn assert_reports(break_it: impl FnOnce(&mut FileDescriptorSet), expected: &[&str]) {
    let old = v0_1_0();
    let mut new = old.clone();
    break_it(&mut new);
    assert_eq!(reported(&old, &new), expected);
}

/// Asserts that changing `v0.1.0` with `change` is reported as nothing.
fn assert_compatible(change: impl FnOnce(&mut FileDescriptorSet)) {
    assert_reports(change, &[]);
}

fn file_mut<'a>(set: &'a mut FileDescriptorSet, package: &str) -> &'a mut FileDescriptorProto {
    set.file
        .iter_mut()
        .find(|file| file.package() == package)
        .unwrap_or_else(|| panic!("no file of package {package}"))
}

const ADMISSION: &str = "poolgate.admission.v1";
const SELECTOR: &str = "poolgate.selector.v1";

/// The message `path` (`Outer` or `Outer.Nested`) of `package`.
fn message_mut<'a>(
    set: &'a mut FileDescriptorSet,
    package: &str,
    path: &str,
) -> &'a mut DescriptorProto {
    let mut names = path.split('.');
    let first = names.next().unwrap_or_default();
    let mut message = file_mut(set, package)
        .message_type
        .iter_mut()
        .find(|message| message.name() == first)
        .unwrap_or_else(|| panic!("no message {path}"));
    for name in names {
        message = message
            .nested_type
            .iter_mut()
            .find(|nested| nested.name() == name)
            .unwrap_or_else(|| panic!("no message {path}"));
    }
    message
}

fn field_mut<'a>(message: &'a mut DescriptorProto, name: &str) -> &'a mut FieldDescriptorProto {
    message
        .field
        .iter_mut()
        .find(|field| field.name() == name)
        .unwrap_or_else(|| panic!("no field {name}"))
}

fn remove_field(message: &mut DescriptorProto, name: &str) {
    let before = message.field.len();
    message.field.retain(|field| field.name() != name);
    assert_eq!(message.field.len(), before - 1, "no field {name}");
}

fn enum_mut<'a>(
    set: &'a mut FileDescriptorSet,
    package: &str,
    name: &str,
) -> &'a mut EnumDescriptorProto {
    file_mut(set, package)
        .enum_type
        .iter_mut()
        .find(|enumeration| enumeration.name() == name)
        .unwrap_or_else(|| panic!("no enum {name}"))
}

fn service_mut<'a>(
    set: &'a mut FileDescriptorSet,
    package: &str,
    name: &str,
) -> &'a mut ServiceDescriptorProto {
    file_mut(set, package)
        .service
        .iter_mut()
        .find(|service| service.name() == name)
        .unwrap_or_else(|| panic!("no service {name}"))
}

fn rpc_mut<'a>(
    service: &'a mut ServiceDescriptorProto,
    name: &str,
) -> &'a mut MethodDescriptorProto {
    service
        .method
        .iter_mut()
        .find(|rpc| rpc.name() == name)
        .unwrap_or_else(|| panic!("no rpc {name}"))
}

fn oneof_index(message: &DescriptorProto, name: &str) -> i32 {
    let index = message
        .oneof_decl
        .iter()
        .position(|oneof| oneof.name() == name)
        .unwrap_or_else(|| panic!("no oneof {name}"));
    i32::try_from(index).expect("a small index")
}

// The CI check.

#[test]
fn the_current_protos_are_compatible_with_the_newest_release() {
    let dir = releases_dir();
    let newest = release::newest_release(&dir)
        .expect("proto/releases lists only release directories")
        .expect("at least one release is recorded");
    let released = release::read_release(&dir, newest).expect("the newest release decodes");
    let current = release::current_descriptor_set().expect("the current protos decode");
    let changes = compat::breaking_changes(&released, &current);
    assert!(
        changes.is_empty(),
        "the protos have {} wire-breaking changes since release {newest} (retire a field by reserving its \
         number, add instead of changing):\n{}",
        changes.len(),
        changes
            .iter()
            .map(|change| format!("  {change}"))
            .collect::<Vec<_>>()
            .join("\n"),
    );
}

#[test]
fn the_workspace_version_has_its_release_recorded() {
    let version = env!("CARGO_PKG_VERSION");
    let tag = ReleaseTag::parse(&format!("v{version}")).expect("the workspace version is semver");
    let path = release::descriptor_path(&releases_dir(), tag);
    assert!(
        path.is_file(),
        "{} is missing: record the release with `cargo run -p poolgate-proto --example \
         release_descriptor -- {tag}`",
        path.display(),
    );
    let set = release::read_release(&releases_dir(), tag).expect("the release decodes");
    let packages: Vec<&str> = set.file.iter().map(|file| file.package()).collect();
    assert!(
        packages.contains(&ADMISSION) && packages.contains(&SELECTOR),
        "{packages:?}"
    );
}

#[test]
fn a_stored_release_carries_no_comments() {
    for tag in release::releases(&releases_dir()).expect("release directories") {
        let set = release::read_release(&releases_dir(), tag).expect("the release decodes");
        assert!(
            set.file.iter().all(|file| file.source_code_info.is_none()),
            "{tag} keeps source_code_info: comments would churn it"
        );
    }
}

#[test]
fn the_current_descriptor_is_stripped_of_comments_and_only_of_them() {
    let raw = FileDescriptorSet::decode(poolgate_proto::FILE_DESCRIPTOR_SET).expect("decodes");
    assert!(raw.file.iter().any(|file| file.source_code_info.is_some()));
    let stripped = release::current_descriptor_set().expect("decodes");
    let mut expected = raw.clone();
    release::strip_source_code_info(&mut expected);
    assert_eq!(stripped, expected);
    assert!(compat::breaking_changes(&raw, &stripped).is_empty());
}

// Broken copies of the release: each must be reported, naming the element.

#[test]
fn a_removed_field_is_breaking() {
    assert_reports(
        |set| remove_field(message_mut(set, ADMISSION, "Acquire"), "wait_ms"),
        &["poolgate.admission.v1.Acquire.wait_ms (9): removed (reserve its number to retire it)"],
    );
}

#[test]
fn a_removed_field_whose_number_is_reserved_is_compatible() {
    assert_compatible(|set| {
        let acquire = message_mut(set, ADMISSION, "Acquire");
        remove_field(acquire, "wait_ms");
        acquire.reserved_range.push(ReservedRange {
            start: Some(9),
            end: Some(10),
        });
        acquire.reserved_name.push("wait_ms".to_owned());
    });
}

#[test]
fn a_removed_field_whose_name_alone_is_reserved_is_breaking() {
    assert_reports(
        |set| {
            let acquire = message_mut(set, ADMISSION, "Acquire");
            remove_field(acquire, "wait_ms");
            acquire.reserved_name.push("wait_ms".to_owned());
            // A range that stops just short of 9 (a message's range excludes its end). Number 8
            // is in use, which protoc would refuse; the checker reads only the ranges.
            acquire.reserved_range.push(ReservedRange {
                start: Some(8),
                end: Some(9),
            });
        },
        &["poolgate.admission.v1.Acquire.wait_ms (9): removed (reserve its number to retire it)"],
    );
}

#[test]
fn a_renumbered_field_is_breaking() {
    assert_reports(
        |set| field_mut(message_mut(set, ADMISSION, "Acquire"), "user_id").number = Some(40),
        &["poolgate.admission.v1.Acquire.user_id (4): renumbered to 40"],
    );
}

#[test]
fn a_renamed_field_is_breaking() {
    assert_reports(
        |set| {
            field_mut(message_mut(set, ADMISSION, "Release"), "tokens").name =
                Some("token_count".to_owned())
        },
        &["poolgate.admission.v1.Release.tokens (2): renamed to token_count"],
    );
}

#[test]
fn a_field_whose_scalar_type_changed_is_breaking() {
    assert_reports(
        |set| field_mut(message_mut(set, ADMISSION, "Release"), "tokens").set_type(Type::Int64),
        &["poolgate.admission.v1.Release.tokens (2): type changed from uint64 to int64"],
    );
}

#[test]
fn a_field_whose_message_or_enum_type_changed_is_breaking() {
    assert_reports(
        |set| {
            field_mut(message_mut(set, ADMISSION, "Resume"), "terms").type_name =
                Some(".poolgate.admission.v1.Heartbeat".to_owned());
            field_mut(message_mut(set, ADMISSION, "Denied"), "reason").type_name =
                Some(".poolgate.admission.v1.LostReason".to_owned());
        },
        &[
            "poolgate.admission.v1.Resume.terms (2): type changed from poolgate.admission.v1.Acquire \
             to poolgate.admission.v1.Heartbeat",
            "poolgate.admission.v1.Denied.reason (1): type changed from \
             poolgate.admission.v1.DenyReason to poolgate.admission.v1.LostReason",
        ],
    );
}

#[test]
fn a_repeated_field_made_singular_is_breaking() {
    assert_reports(
        |set| {
            field_mut(
                message_mut(set, ADMISSION, "InflightRequest"),
                "account_ids",
            )
            .set_label(Label::Optional)
        },
        &[
            "poolgate.admission.v1.InflightRequest.account_ids (1): changed from repeated to singular",
        ],
    );
}

#[test]
fn a_map_whose_value_type_changed_is_breaking() {
    assert_reports(
        |set| {
            let entry = message_mut(set, ADMISSION, "ChannelRequest.TraceContextEntry");
            field_mut(entry, "value").set_type(Type::Bytes);
        },
        &[
            "poolgate.admission.v1.ChannelRequest.trace_context (4): type changed from \
           map<string, string> to map<string, bytes>",
        ],
    );
}

#[test]
fn a_map_made_a_repeated_string_is_breaking_and_its_entry_is_not_reported_apart() {
    assert_reports(
        |set| {
            let request = message_mut(set, ADMISSION, "ChannelRequest");
            request.nested_type.clear();
            let field = field_mut(request, "trace_context");
            field.set_type(Type::String);
            field.type_name = None;
        },
        &[
            "poolgate.admission.v1.ChannelRequest.trace_context (4): type changed from \
           map<string, string> to string",
        ],
    );
}

#[test]
fn a_removed_map_field_whose_number_is_reserved_is_compatible() {
    assert_compatible(|set| {
        let request = message_mut(set, ADMISSION, "ChannelRequest");
        remove_field(request, "trace_context");
        request.nested_type.clear();
        request.reserved_range.push(ReservedRange {
            start: Some(4),
            end: Some(5),
        });
    });
}

#[test]
fn optional_and_implicit_presence_are_compatible() {
    assert_compatible(|set| {
        let acquire = message_mut(set, ADMISSION, "Acquire");
        // `optional string user_id` becomes `string user_id`: its synthetic oneof goes.
        let synthetic = oneof_index(acquire, "_user_id");
        acquire
            .oneof_decl
            .remove(usize::try_from(synthetic).expect("an index"));
        for field in &mut acquire.field {
            match field.oneof_index {
                Some(index) if index == synthetic => {
                    field.oneof_index = None;
                    field.proto3_optional = None;
                }
                Some(index) if index > synthetic => field.oneof_index = Some(index - 1),
                _ => {}
            }
        }
        // `int32 rpm_limit` becomes `optional int32 rpm_limit`.
        acquire.oneof_decl.push(OneofDescriptorProto {
            name: Some("_rpm_limit".to_owned()),
            options: None,
        });
        let synthetic = i32::try_from(acquire.oneof_decl.len() - 1).expect("an index");
        let rpm_limit = field_mut(acquire, "rpm_limit");
        rpm_limit.oneof_index = Some(synthetic);
        rpm_limit.proto3_optional = Some(true);
    });
}

#[test]
fn a_field_moved_into_a_oneof_is_breaking() {
    assert_reports(
        |set| {
            let request = message_mut(set, ADMISSION, "ChannelRequest");
            let kind = oneof_index(request, "kind");
            field_mut(request, "tag").oneof_index = Some(kind);
        },
        &["poolgate.admission.v1.ChannelRequest.tag (1): moved into oneof kind"],
    );
}

#[test]
fn a_field_moved_out_of_a_oneof_is_breaking() {
    assert_reports(
        |set| field_mut(message_mut(set, ADMISSION, "LeaseRequest"), "acquire").oneof_index = None,
        &["poolgate.admission.v1.LeaseRequest.acquire (1): moved out of oneof kind"],
    );
}

#[test]
fn a_removed_message_in_use_is_breaking() {
    assert_reports(
        |set| {
            file_mut(set, ADMISSION)
                .message_type
                .retain(|message| message.name() != "Heartbeat")
        },
        &["poolgate.admission.v1.Heartbeat: message removed"],
    );
}

#[test]
fn a_removed_enum_is_breaking() {
    assert_reports(
        |set| {
            file_mut(set, ADMISSION)
                .enum_type
                .retain(|enumeration| enumeration.name() != "LostReason")
        },
        &["poolgate.admission.v1.LostReason: enum removed"],
    );
}

#[test]
fn a_removed_enum_value_is_breaking() {
    assert_reports(
        |set| {
            enum_mut(set, ADMISSION, "DenyReason")
                .value
                .retain(|value| value.name() != "DENY_REASON_KEY_BUDGET")
        },
        &[
            "poolgate.admission.v1.DenyReason.DENY_REASON_KEY_BUDGET (11): removed (reserve its \
           number to retire it)",
        ],
    );
}

#[test]
fn a_removed_enum_value_whose_number_is_reserved_is_compatible() {
    assert_compatible(|set| {
        let reason = enum_mut(set, ADMISSION, "DenyReason");
        reason
            .value
            .retain(|value| value.name() != "DENY_REASON_KEY_BUDGET");
        // An enum's reserved range, unlike a message's, includes its end.
        reason.reserved_range.push(EnumReservedRange {
            start: Some(11),
            end: Some(11),
        });
    });
}

#[test]
fn a_renumbered_or_renamed_enum_value_is_breaking() {
    assert_reports(
        |set| {
            let reason = enum_mut(set, ADMISSION, "DenyReason");
            for value in &mut reason.value {
                match value.name() {
                    "DENY_REASON_RPM" => value.number = Some(20),
                    "DENY_REASON_COOLING" => value.name = Some("DENY_REASON_COOLDOWN".to_owned()),
                    _ => {}
                }
            }
        },
        &[
            "poolgate.admission.v1.DenyReason.DENY_REASON_RPM (2): renumbered to 20",
            "poolgate.admission.v1.DenyReason.DENY_REASON_COOLING (5): renamed to \
             DENY_REASON_COOLDOWN",
        ],
    );
}

#[test]
fn a_removed_rpc_is_breaking() {
    assert_reports(
        |set| {
            service_mut(set, ADMISSION, "Admission")
                .method
                .retain(|rpc| rpc.name() != "Release")
        },
        &["poolgate.admission.v1.Admission.Release: rpc removed"],
    );
}

#[test]
fn an_rpc_whose_streaming_changed_is_breaking() {
    assert_reports(
        |set| {
            let admission = service_mut(set, ADMISSION, "Admission");
            rpc_mut(admission, "Lease").client_streaming = Some(false);
            rpc_mut(admission, "Inflight").server_streaming = Some(true);
        },
        &[
            "poolgate.admission.v1.Admission.Lease: request changed from stream to unary",
            "poolgate.admission.v1.Admission.Inflight: response changed from unary to stream",
        ],
    );
}

#[test]
fn an_rpc_whose_request_or_response_type_changed_is_breaking() {
    assert_reports(
        |set| {
            let selector = service_mut(set, SELECTOR, "Selector");
            rpc_mut(selector, "Select").input_type =
                Some(".poolgate.selector.v1.ListModelsRequest".to_owned());
            rpc_mut(selector, "Select").output_type =
                Some(".poolgate.selector.v1.ListModelsResponse".to_owned());
        },
        &[
            "poolgate.selector.v1.Selector.Select: request type changed from \
             poolgate.selector.v1.SelectRequest to poolgate.selector.v1.ListModelsRequest",
            "poolgate.selector.v1.Selector.Select: response type changed from \
             poolgate.selector.v1.SelectResponse to poolgate.selector.v1.ListModelsResponse",
        ],
    );
}

#[test]
fn a_removed_service_is_breaking() {
    assert_reports(
        |set| {
            file_mut(set, SELECTOR)
                .service
                .retain(|service| service.name() != "SelectorAdmin")
        },
        &["poolgate.selector.v1.SelectorAdmin: service removed"],
    );
}

#[test]
fn a_renamed_package_reads_as_removals() {
    let old = v0_1_0();
    let mut new = old.clone();
    file_mut(&mut new, ADMISSION).package = Some("poolgate.admission.v2".to_owned());
    let changes = compat::breaking_changes(&old, &new);
    let admission = old
        .file
        .iter()
        .find(|file| file.package() == ADMISSION)
        .expect("the admission file");
    let top_level_types =
        admission.message_type.len() + admission.enum_type.len() + admission.service.len();
    // Every top-level type of the file is reported removed, once (the map entry nested in
    // `ChannelRequest` is judged with its field, not apart; elements with three dots are
    // `poolgate.admission.v1.Name`).
    let reported_types = changes
        .iter()
        .filter(|change| {
            matches!(
                change.change,
                Change::MessageRemoved | Change::EnumRemoved | Change::ServiceRemoved
            ) && change.element.matches('.').count() == 3
        })
        .count();
    assert_eq!(reported_types, top_level_types);
    let messages = reported(&old, &new);
    for expected in [
        "poolgate/admission/v1/admission.proto: package changed to poolgate.admission.v2",
        "poolgate.admission.v1.Acquire: message removed",
        "poolgate.admission.v1.DenyReason: enum removed",
        "poolgate.admission.v1.Admission: service removed",
    ] {
        assert!(
            messages.iter().any(|message| message == expected),
            "{expected} in {messages:#?}"
        );
    }
    assert!(
        !messages.iter().any(|message| message.contains("selector")),
        "only admission's types moved: {messages:#?}"
    );
}

#[test]
fn a_renamed_file_is_breaking() {
    assert_reports(
        |set| file_mut(set, ADMISSION).name = Some("poolgate/admission/v1/lease.proto".to_owned()),
        &["poolgate/admission/v1/admission.proto: file removed (or renamed)"],
    );
}

// What may change.

#[test]
fn a_release_is_compatible_with_itself() {
    assert_compatible(|_| {});
}

#[test]
fn additions_are_compatible() {
    assert_compatible(|set| {
        let acquire = message_mut(set, ADMISSION, "Acquire");
        acquire.field.push(FieldDescriptorProto {
            name: Some("priority".to_owned()),
            number: Some(17),
            label: Some(Label::Optional.into()),
            r#type: Some(Type::Int32.into()),
            json_name: Some("priority".to_owned()),
            ..FieldDescriptorProto::default()
        });
        enum_mut(set, ADMISSION, "DenyReason")
            .value
            .push(EnumValueDescriptorProto {
                name: Some("DENY_REASON_MAINTENANCE".to_owned()),
                number: Some(12),
                options: None,
            });
        let admission_file = file_mut(set, ADMISSION);
        admission_file.message_type.push(DescriptorProto {
            name: Some("PingRequest".to_owned()),
            ..DescriptorProto::default()
        });
        service_mut(set, ADMISSION, "Admission")
            .method
            .push(MethodDescriptorProto {
                name: Some("Ping".to_owned()),
                input_type: Some(".poolgate.admission.v1.PingRequest".to_owned()),
                output_type: Some(".poolgate.admission.v1.Released".to_owned()),
                ..MethodDescriptorProto::default()
            });
        file_mut(set, SELECTOR)
            .service
            .push(ServiceDescriptorProto {
                name: Some("SelectorDebug".to_owned()),
                ..ServiceDescriptorProto::default()
            });
        set.file.push(FileDescriptorProto {
            name: Some("poolgate/audit/v1/audit.proto".to_owned()),
            package: Some("poolgate.audit.v1".to_owned()),
            ..FileDescriptorProto::default()
        });
    });
}

#[test]
fn every_break_of_one_copy_is_reported_at_once() {
    let changes = {
        let old = v0_1_0();
        let mut new = old.clone();
        remove_field(message_mut(&mut new, ADMISSION, "Acquire"), "wait_ms");
        field_mut(message_mut(&mut new, ADMISSION, "Release"), "tokens").set_type(Type::Int64);
        service_mut(&mut new, ADMISSION, "Admission")
            .method
            .retain(|rpc| rpc.name() != "Release");
        compat::breaking_changes(&old, &new)
    };
    let kinds: Vec<&Change> = changes.iter().map(|change| &change.change).collect();
    assert_eq!(
        kinds,
        [
            &Change::FieldRemoved,
            &Change::FieldTypeChanged {
                old_type: "uint64".to_owned(),
                new_type: "int64".to_owned()
            },
            &Change::RpcRemoved,
        ]
    );
}

#[test]
fn encoded_sets_are_checked_and_garbage_is_an_error() {
    let encoded = v0_1_0().encode_to_vec();
    let changes = compat::breaking_changes_encoded(&encoded, poolgate_proto::FILE_DESCRIPTOR_SET)
        .expect("both decode");
    assert!(changes.is_empty(), "{changes:?}");
    assert!(compat::breaking_changes_encoded(&[0xff, 0xff], &encoded).is_err());
}

// Finding and writing releases.

#[test]
fn the_newest_release_is_the_highest_version_not_the_last_name() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    for name in ["v0.9.0", "v0.10.0", "v0.2.0"] {
        std::fs::create_dir(dir.path().join(name)).expect("a release directory");
    }
    std::fs::write(dir.path().join("README.md"), "not a release").expect("a file");
    let newest = release::newest_release(dir.path()).expect("release directories");
    assert_eq!(newest, Some(ReleaseTag::parse("v0.10.0").expect("a tag")));

    std::fs::create_dir(dir.path().join("latest")).expect("a directory");
    assert!(matches!(
        release::newest_release(dir.path()),
        Err(ReleaseError::BadTag(name)) if name == "latest"
    ));
}

#[test]
fn no_releases_directory_means_no_release() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let missing = dir.path().join("releases");
    assert_eq!(release::newest_release(&missing).expect("no error"), None);
}

#[test]
fn release_tags_are_v_major_minor_patch_only() {
    let tag = ReleaseTag::parse("v1.20.3").expect("a tag");
    assert_eq!((tag.major, tag.minor, tag.patch), (1, 20, 3));
    assert_eq!(tag.to_string(), "v1.20.3");
    for bad in [
        "1.2.3",
        "v1.2",
        "v1.2.3.4",
        "v1.2.3-rc.1",
        "v01.2.3",
        "v1..3",
        "v1.2.x",
        "",
    ] {
        assert!(ReleaseTag::parse(bad).is_err(), "{bad:?} was taken");
    }
}

#[test]
fn a_written_release_reads_back_and_is_not_overwritten_unless_asked() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let tag = ReleaseTag::parse("v0.1.0").expect("a tag");
    let current = release::current_descriptor_set().expect("decodes");
    let path = release::write_release(dir.path(), tag, &current, false).expect("written");
    assert_eq!(path, dir.path().join("v0.1.0").join("poolgate.binpb"));
    assert_eq!(
        release::read_release(dir.path(), tag).expect("reads"),
        current
    );

    let other = v0_1_0();
    assert!(matches!(
        release::write_release(dir.path(), tag, &FileDescriptorSet::default(), false),
        Err(ReleaseError::Exists(_))
    ));
    assert_eq!(
        release::read_release(dir.path(), tag).expect("reads"),
        current
    );
    release::write_release(dir.path(), tag, &other, true).expect("overwritten when asked");
    assert_eq!(
        release::read_release(dir.path(), tag).expect("reads"),
        other
    );
}
