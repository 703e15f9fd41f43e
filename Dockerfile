# One image with the three service binaries (and mock-upstream for demos); the Helm chart runs
# each Deployment with its own command. Multi-stage: build with the Rust toolchain, run on a
# small non-root base.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p admission-svc -p selector-svc -p relay-svc -p poolgate-testkit --bins \
 && mkdir -p /out \
 && cp target/release/admission-svc target/release/selector-svc target/release/relay-svc target/release/mock-upstream /out/

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/ /usr/local/bin/
USER 65532:65532
EXPOSE 8080 50061 50062 9461 9462
ENTRYPOINT []
CMD ["/usr/local/bin/relay-svc", "--standalone"]
