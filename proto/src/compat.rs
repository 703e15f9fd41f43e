//! The wire-compatibility check between two file descriptor sets: the protos of the last release
//! and the protos of now. [`breaking_changes`] lists every change an old client or server could
//! trip over, each naming the element it concerns (`poolgate.admission.v1.Acquire.wait_ms (9):
//! removed`); additions are not listed.
//!
//! What counts as breaking, and why:
//!
//! | change | verdict |
//! |---|---|
//! | file removed or renamed, or its package changed | breaking (importers name the path; every type in it changes its full name) |
//! | message, enum or service removed (package renames included) | breaking, whether or not anything still refers to it: generated code and `google.protobuf.Any` name it; a map's `*Entry` message is judged as its field's type instead |
//! | field removed | breaking, unless its number is `reserved` in the new message (the proto way to retire a field) |
//! | field renumbered (same name, another number) | breaking |
//! | field renamed (its number now carries another name) | breaking: JSON and generated code name it; reserve the old number and add a field instead |
//! | field type changed | breaking: any scalar change (even the ones protobuf calls wire-compatible, such as `int32`→`int64`, truncate or reinterpret values), another message or enum type, a map's key or value type, a map ↔ a repeated message |
//! | repeated ↔ singular (or required) | breaking |
//! | proto3 `optional` ↔ implicit presence | compatible: both encode the same tag and value; the synthetic `_name` oneof of `optional` is not a oneof here |
//! | field moved into, out of, or between oneofs | breaking, always. Protobuf allows moving one field into a *new* oneof, but not several, nor into an existing one; one simple rule keeps a reviewer from judging which case it is. Add new fields in the oneof instead |
//! | enum value removed | breaking, unless its number is `reserved` in the new enum |
//! | enum value renumbered, or renamed (its number now carries another name) | breaking |
//! | rpc removed | breaking |
//! | rpc request or response type changed | breaking |
//! | rpc streaming changed (either side) | breaking |
//! | new file, message, enum, field, enum value, service or rpc | compatible |
//!
//! Options (`deprecated`, `json_name`, …) and comments are not compared.

use std::collections::HashMap;
use std::fmt;

use prost::Message;
use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::{
    DescriptorProto, EnumDescriptorProto, FieldDescriptorProto, FileDescriptorSet,
    MethodDescriptorProto, ServiceDescriptorProto,
};

/// One wire-breaking change: the element it concerns and what happened to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BreakingChange {
    /// The element's full name as the old protos spell it: a file path, a type's full name
    /// (`poolgate.admission.v1.Acquire`), a field or enum value with its number
    /// (`poolgate.admission.v1.Acquire.wait_ms (9)`), or an rpc (`poolgate.admission.v1.Admission.Lease`).
    pub element: String,
    /// What happened to it.
    pub change: Change,
}

impl fmt::Display for BreakingChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.element, self.change)
    }
}

/// The kinds of wire-breaking change the check reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    FileRemoved,
    PackageChanged {
        new_package: String,
    },
    MessageRemoved,
    EnumRemoved,
    ServiceRemoved,
    FieldRemoved,
    FieldRenumbered {
        new_number: i32,
    },
    /// The field's number now carries a field of another name.
    FieldRenamed {
        new_name: String,
    },
    FieldTypeChanged {
        old_type: String,
        new_type: String,
    },
    FieldCardinalityChanged {
        old: Cardinality,
        new: Cardinality,
    },
    /// `None` is "in no oneof".
    FieldOneofChanged {
        old_oneof: Option<String>,
        new_oneof: Option<String>,
    },
    EnumValueRemoved,
    EnumValueRenumbered {
        new_number: i32,
    },
    /// The value's number now carries a value of another name.
    EnumValueRenamed {
        new_name: String,
    },
    RpcRemoved,
    RpcTypeChanged {
        side: RpcSide,
        old_type: String,
        new_type: String,
    },
    RpcStreamingChanged {
        side: RpcSide,
        was_streaming: bool,
    },
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Change::FileRemoved => write!(f, "file removed (or renamed)"),
            Change::PackageChanged { new_package } => {
                write!(f, "package changed to {new_package}")
            }
            Change::MessageRemoved => write!(f, "message removed"),
            Change::EnumRemoved => write!(f, "enum removed"),
            Change::ServiceRemoved => write!(f, "service removed"),
            Change::FieldRemoved | Change::EnumValueRemoved => {
                write!(f, "removed (reserve its number to retire it)")
            }
            Change::FieldRenumbered { new_number } | Change::EnumValueRenumbered { new_number } => {
                write!(f, "renumbered to {new_number}")
            }
            Change::FieldRenamed { new_name } | Change::EnumValueRenamed { new_name } => {
                write!(f, "renamed to {new_name}")
            }
            Change::FieldTypeChanged { old_type, new_type } => {
                write!(f, "type changed from {old_type} to {new_type}")
            }
            Change::FieldCardinalityChanged { old, new } => {
                write!(f, "changed from {old} to {new}")
            }
            Change::FieldOneofChanged {
                old_oneof,
                new_oneof,
            } => match (old_oneof, new_oneof) {
                (None, Some(new)) => write!(f, "moved into oneof {new}"),
                (Some(old), None) => write!(f, "moved out of oneof {old}"),
                (Some(old), Some(new)) => write!(f, "moved from oneof {old} to oneof {new}"),
                (None, None) => write!(f, "oneof unchanged"),
            },
            Change::RpcRemoved => write!(f, "rpc removed"),
            Change::RpcTypeChanged {
                side,
                old_type,
                new_type,
            } => {
                write!(f, "{side} type changed from {old_type} to {new_type}")
            }
            Change::RpcStreamingChanged {
                side,
                was_streaming,
            } => {
                let (old, new) = if *was_streaming {
                    ("stream", "unary")
                } else {
                    ("unary", "stream")
                };
                write!(f, "{side} changed from {old} to {new}")
            }
        }
    }
}

/// Which half of an rpc changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RpcSide {
    Request,
    Response,
}

impl fmt::Display for RpcSide {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RpcSide::Request => "request",
            RpcSide::Response => "response",
        })
    }
}

/// How many values a field holds. A proto3 `optional` field and an implicit-presence one are
/// both `Singular`: they are the same on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cardinality {
    Singular,
    Required,
    Repeated,
}

impl fmt::Display for Cardinality {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Cardinality::Singular => "singular",
            Cardinality::Required => "required",
            Cardinality::Repeated => "repeated",
        })
    }
}

/// The breaking changes from the encoded set `old` to the encoded set `new`; an error when
/// either is not an encoded `FileDescriptorSet`.
pub fn breaking_changes_encoded(
    old: &[u8],
    new: &[u8],
) -> Result<Vec<BreakingChange>, prost::DecodeError> {
    let old = FileDescriptorSet::decode(old)?;
    let new = FileDescriptorSet::decode(new)?;
    Ok(breaking_changes(&old, &new))
}

/// Every wire-breaking change from `old` (the last release's protos) to `new`, in the order of
/// the old protos: files, then messages with their fields, enums with their values, and services
/// with their rpcs. Empty when `new` only adds to `old`.
pub fn breaking_changes(old: &FileDescriptorSet, new: &FileDescriptorSet) -> Vec<BreakingChange> {
    let old_index = Index::of(old);
    let new_index = Index::of(new);
    let mut changes = Vec::new();

    let new_files: HashMap<&str, &str> = new
        .file
        .iter()
        .map(|file| (file.name(), file.package()))
        .collect();
    for file in &old.file {
        match new_files.get(file.name()) {
            None => changes.push(BreakingChange {
                element: file.name().to_owned(),
                change: Change::FileRemoved,
            }),
            Some(&new_package) if new_package != file.package() => changes.push(BreakingChange {
                element: file.name().to_owned(),
                change: Change::PackageChanged {
                    new_package: new_package.to_owned(),
                },
            }),
            Some(_) => {}
        }
    }

    for (name, old_message) in &old_index.messages {
        if is_map_entry(old_message) {
            continue;
        }
        match new_index.messages_by_name.get(name.as_str()) {
            None => changes.push(BreakingChange {
                element: name.clone(),
                change: Change::MessageRemoved,
            }),
            Some(&new_message) => compare_messages(
                name,
                (old_message, &old_index),
                (new_message, &new_index),
                &mut changes,
            ),
        }
    }

    for (name, old_enum) in &old_index.enums {
        match new_index.enums_by_name.get(name.as_str()) {
            None => changes.push(BreakingChange {
                element: name.clone(),
                change: Change::EnumRemoved,
            }),
            Some(&new_enum) => compare_enums(name, old_enum, new_enum, &mut changes),
        }
    }

    for (name, old_service) in &old_index.services {
        match new_index.services_by_name.get(name.as_str()) {
            None => changes.push(BreakingChange {
                element: name.clone(),
                change: Change::ServiceRemoved,
            }),
            Some(&new_service) => compare_services(name, old_service, new_service, &mut changes),
        }
    }

    changes
}

/// The messages, enums and services of a set by full name (no leading dot), nested ones
/// included: in the order the files declare them (for a report in that order), and by name.
#[derive(Default)]
struct Index<'a> {
    messages: Vec<(String, &'a DescriptorProto)>,
    enums: Vec<(String, &'a EnumDescriptorProto)>,
    services: Vec<(String, &'a ServiceDescriptorProto)>,
    messages_by_name: HashMap<String, &'a DescriptorProto>,
    enums_by_name: HashMap<String, &'a EnumDescriptorProto>,
    services_by_name: HashMap<String, &'a ServiceDescriptorProto>,
}

impl<'a> Index<'a> {
    fn of(set: &'a FileDescriptorSet) -> Self {
        let mut index = Index::default();
        for file in &set.file {
            let scope = file.package();
            for message in &file.message_type {
                index.add_message(scope, message);
            }
            for enumeration in &file.enum_type {
                index.add_enum(scope, enumeration);
            }
            for service in &file.service {
                let name = qualify(scope, service.name());
                index.services_by_name.insert(name.clone(), service);
                index.services.push((name, service));
            }
        }
        index
    }

    fn add_message(&mut self, scope: &str, message: &'a DescriptorProto) {
        let name = qualify(scope, message.name());
        self.messages_by_name.insert(name.clone(), message);
        self.messages.push((name.clone(), message));
        for nested in &message.nested_type {
            self.add_message(&name, nested);
        }
        for enumeration in &message.enum_type {
            self.add_enum(&name, enumeration);
        }
    }

    fn add_enum(&mut self, scope: &str, enumeration: &'a EnumDescriptorProto) {
        let name = qualify(scope, enumeration.name());
        self.enums_by_name.insert(name.clone(), enumeration);
        self.enums.push((name, enumeration));
    }

    /// A field's type as a reader sees it: a scalar's proto name, a message's or enum's full
    /// name, or `map<K, V>` for a map field (whose `*Entry` message is an implementation detail:
    /// two maps compare by their key and value types, not by the entry's name).
    fn field_type(&self, field: &FieldDescriptorProto) -> String {
        let type_name = field.type_name().trim_start_matches('.');
        match field.r#type() {
            Type::Message => match self.messages_by_name.get(type_name) {
                Some(entry) if is_map_entry(entry) => {
                    let part = |number| {
                        entry
                            .field
                            .iter()
                            .find(|field| field.number() == number)
                            .map_or_else(|| "?".to_owned(), |field| self.field_type(field))
                    };
                    format!("map<{}, {}>", part(1), part(2))
                }
                _ => type_name.to_owned(),
            },
            Type::Enum => type_name.to_owned(),
            Type::Group => format!("group {type_name}"),
            scalar => scalar_name(scalar).to_owned(),
        }
    }
}

fn compare_messages(
    message_name: &str,
    (old_message, old_index): (&DescriptorProto, &Index<'_>),
    (new_message, new_index): (&DescriptorProto, &Index<'_>),
    changes: &mut Vec<BreakingChange>,
) {
    for old_field in &old_message.field {
        let element = format!(
            "{message_name}.{} ({})",
            old_field.name(),
            old_field.number()
        );
        let mut report = |change| {
            changes.push(BreakingChange {
                element: element.clone(),
                change,
            })
        };
        let same_name = new_message
            .field
            .iter()
            .find(|field| field.name() == old_field.name());
        let same_number = new_message
            .field
            .iter()
            .find(|field| field.number() == old_field.number());
        let new_field = match (same_name, same_number) {
            (Some(new_field), _) => {
                if new_field.number() != old_field.number() {
                    report(Change::FieldRenumbered {
                        new_number: new_field.number(),
                    });
                }
                new_field
            }
            (None, Some(new_field)) => {
                report(Change::FieldRenamed {
                    new_name: new_field.name().to_owned(),
                });
                new_field
            }
            (None, None) => {
                if !message_reserves(new_message, old_field.number()) {
                    report(Change::FieldRemoved);
                }
                continue;
            }
        };

        let old_type = old_index.field_type(old_field);
        let new_type = new_index.field_type(new_field);
        if old_type != new_type {
            report(Change::FieldTypeChanged { old_type, new_type });
        }
        let (old_cardinality, new_cardinality) = (cardinality(old_field), cardinality(new_field));
        if old_cardinality != new_cardinality {
            report(Change::FieldCardinalityChanged {
                old: old_cardinality,
                new: new_cardinality,
            });
        }
        let old_oneof = real_oneof(old_message, old_field);
        let new_oneof = real_oneof(new_message, new_field);
        if old_oneof != new_oneof {
            report(Change::FieldOneofChanged {
                old_oneof: old_oneof.map(str::to_owned),
                new_oneof: new_oneof.map(str::to_owned),
            });
        }
    }
}

fn compare_enums(
    enum_name: &str,
    old_enum: &EnumDescriptorProto,
    new_enum: &EnumDescriptorProto,
    changes: &mut Vec<BreakingChange>,
) {
    for old_value in &old_enum.value {
        let element = format!("{enum_name}.{} ({})", old_value.name(), old_value.number());
        let same_name = new_enum
            .value
            .iter()
            .find(|value| value.name() == old_value.name());
        let same_number = new_enum
            .value
            .iter()
            .find(|value| value.number() == old_value.number());
        let change = match (same_name, same_number) {
            (Some(new_value), _) if new_value.number() == old_value.number() => None,
            (Some(new_value), _) => Some(Change::EnumValueRenumbered {
                new_number: new_value.number(),
            }),
            (None, Some(new_value)) => Some(Change::EnumValueRenamed {
                new_name: new_value.name().to_owned(),
            }),
            (None, None) if enum_reserves(new_enum, old_value.number()) => None,
            (None, None) => Some(Change::EnumValueRemoved),
        };
        if let Some(change) = change {
            changes.push(BreakingChange {
                element: element.clone(),
                change,
            });
        }
    }
}

fn compare_services(
    service_name: &str,
    old_service: &ServiceDescriptorProto,
    new_service: &ServiceDescriptorProto,
    changes: &mut Vec<BreakingChange>,
) {
    for old_rpc in &old_service.method {
        let element = format!("{service_name}.{}", old_rpc.name());
        let Some(new_rpc) = new_service
            .method
            .iter()
            .find(|rpc| rpc.name() == old_rpc.name())
        else {
            changes.push(BreakingChange {
                element,
                change: Change::RpcRemoved,
            });
            continue;
        };
        for side in [RpcSide::Request, RpcSide::Response] {
            let (old_type, new_type) = (rpc_type(old_rpc, side), rpc_type(new_rpc, side));
            if old_type != new_type {
                changes.push(BreakingChange {
                    element: element.clone(),
                    change: Change::RpcTypeChanged {
                        side,
                        old_type: old_type.to_owned(),
                        new_type: new_type.to_owned(),
                    },
                });
            }
            let was_streaming = rpc_streams(old_rpc, side);
            if was_streaming != rpc_streams(new_rpc, side) {
                changes.push(BreakingChange {
                    element: element.clone(),
                    change: Change::RpcStreamingChanged {
                        side,
                        was_streaming,
                    },
                });
            }
        }
    }
}

fn qualify(scope: &str, name: &str) -> String {
    if scope.is_empty() {
        name.to_owned()
    } else {
        format!("{scope}.{name}")
    }
}

fn is_map_entry(message: &DescriptorProto) -> bool {
    message
        .options
        .as_ref()
        .is_some_and(|options| options.map_entry())
}

/// Whether `number` is in one of the message's reserved ranges (whose ends are exclusive).
fn message_reserves(message: &DescriptorProto, number: i32) -> bool {
    message
        .reserved_range
        .iter()
        .any(|range| range.start() <= number && number < range.end())
}

/// Whether `number` is in one of the enum's reserved ranges (whose ends, unlike a message's,
/// are inclusive).
fn enum_reserves(enumeration: &EnumDescriptorProto, number: i32) -> bool {
    enumeration
        .reserved_range
        .iter()
        .any(|range| range.start() <= number && number <= range.end())
}

fn cardinality(field: &FieldDescriptorProto) -> Cardinality {
    match field.label() {
        Label::Repeated => Cardinality::Repeated,
        Label::Required => Cardinality::Required,
        Label::Optional => Cardinality::Singular,
    }
}

/// The oneof the field is declared in, leaving out the synthetic oneof protoc gives a proto3
/// `optional` field (that one changes nothing on the wire).
fn real_oneof<'a>(message: &'a DescriptorProto, field: &FieldDescriptorProto) -> Option<&'a str> {
    if field.proto3_optional() {
        return None;
    }
    let index = usize::try_from(field.oneof_index?).ok()?;
    message.oneof_decl.get(index).map(|oneof| oneof.name())
}

fn rpc_type(rpc: &MethodDescriptorProto, side: RpcSide) -> &str {
    match side {
        RpcSide::Request => rpc.input_type(),
        RpcSide::Response => rpc.output_type(),
    }
    .trim_start_matches('.')
}

fn rpc_streams(rpc: &MethodDescriptorProto, side: RpcSide) -> bool {
    match side {
        RpcSide::Request => rpc.client_streaming(),
        RpcSide::Response => rpc.server_streaming(),
    }
}

fn scalar_name(scalar: Type) -> &'static str {
    match scalar {
        Type::Double => "double",
        Type::Float => "float",
        Type::Int64 => "int64",
        Type::Uint64 => "uint64",
        Type::Int32 => "int32",
        Type::Fixed64 => "fixed64",
        Type::Fixed32 => "fixed32",
        Type::Bool => "bool",
        Type::String => "string",
        Type::Bytes => "bytes",
        Type::Uint32 => "uint32",
        Type::Sfixed32 => "sfixed32",
        Type::Sfixed64 => "sfixed64",
        Type::Sint32 => "sint32",
        Type::Sint64 => "sint64",
        Type::Group => "group",
        Type::Message => "message",
        Type::Enum => "enum",
    }
}
