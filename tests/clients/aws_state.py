"""What moto holds, seen with boto3 (the AWS SDK for Python), for the AWS end-to-end tests.

    aws_state.py ENDPOINT create-zone NAME            -> {"id": ..., "name": ...}
    aws_state.py ENDPOINT upsert ZONE NAME TYPE VALUE -> {"status": ...}
    aws_state.py ENDPOINT upsert-alias ZONE NAME TARGET TARGET_ZONE -> {"status": ...}  (an A alias)
    aws_state.py ENDPOINT records ZONE                -> [{"name", "type", "ttl", "values", "alias"}]
    aws_state.py ENDPOINT zones                       -> [{"id", "name", "callerReference"}]
    aws_state.py ENDPOINT certificates                -> [{"arn", "domain", "names", "status", "tags", "inUseBy"}]
    aws_state.py ENDPOINT load-balancer NAME CERT_ARN -> {"name": ...}  (a classic ELB serving HTTPS
                                                         with the certificate: ACM says it is in use)
    aws_state.py ENDPOINT register-domain NAME YEARS  -> {"operationId": ...}
    aws_state.py ENDPOINT domains                     -> [{"name", "expiry"}]
    aws_state.py ENDPOINT name-servers NAME           -> ["ns-1.example.net", ...]  (the domain's delegation)
    aws_state.py ENDPOINT operations                  -> [{"id", "type", "status", "domain"}]
    aws_state.py ENDPOINT distributions               -> [{"id", "aliases", "origin", "enabled",
                                                         "comment", "priceClass", "cachePolicyId",
                                                         "callerReference", "certificate"}]
    aws_state.py ENDPOINT function NAME CODE          -> {"sha", "hex"}  (creates the function, its IAM
                                                         role first, or updates its code; invocations
                                                         answer without Docker)
    aws_state.py ENDPOINT publish NAME                -> {"version": ..., "sha": ...}
    aws_state.py ENDPOINT alias NAME ALIAS VERSION [CANARY_VERSION WEIGHT] -> {"version": ...}
    aws_state.py ENDPOINT lambda NAME                 -> {"versions": [{"version", "sha"}],
                                                         "aliases": {ALIAS: {"version", "weights"}}}
    aws_state.py ENDPOINT invoke-answers JSON...      -> {}  (what the next invocations return)

Credentials and region come from the environment (moto accepts any).
"""

import base64
import io
import json
import sys
import urllib.request
import uuid
import zipfile

import boto3


def main() -> None:
    endpoint, command, *args = sys.argv[1:]
    r53 = boto3.client("route53", endpoint_url=endpoint, region_name="us-east-1")
    if command == "create-zone":
        (name,) = args
        zone = r53.create_hosted_zone(Name=name, CallerReference=str(uuid.uuid4()))["HostedZone"]
        out = {"id": zone["Id"].split("/")[-1], "name": zone["Name"].rstrip(".")}
    elif command == "upsert":
        zone, name, rtype, value = args
        change = r53.change_resource_record_sets(
            HostedZoneId=zone,
            ChangeBatch={"Changes": [{"Action": "UPSERT", "ResourceRecordSet": {
                "Name": name, "Type": rtype, "TTL": 60, "ResourceRecords": [{"Value": value}]}}]},
        )
        out = {"status": change["ChangeInfo"]["Status"]}
    elif command == "upsert-alias":
        zone, name, target, target_zone = args
        change = r53.change_resource_record_sets(
            HostedZoneId=zone,
            ChangeBatch={"Changes": [{"Action": "UPSERT", "ResourceRecordSet": {
                "Name": name, "Type": "A", "AliasTarget": {
                    "HostedZoneId": target_zone, "DNSName": target,
                    "EvaluateTargetHealth": False}}}]},
        )
        out = {"status": change["ChangeInfo"]["Status"]}
    elif command == "records":
        (zone,) = args
        sets = r53.list_resource_record_sets(HostedZoneId=zone)["ResourceRecordSets"]
        out = sorted(
            (
                {
                    "name": s["Name"].rstrip(".").lower(),
                    "type": s["Type"],
                    "ttl": s.get("TTL"),
                    "values": sorted(r["Value"] for r in s.get("ResourceRecords", [])),
                    "alias": s.get("AliasTarget", {}).get("DNSName", "").rstrip(".") or None,
                }
                for s in sets
                if s["Type"] not in ("NS", "SOA")
            ),
            key=lambda s: (s["name"], s["type"]),
        )
    elif command == "zones":
        out = [
            {"id": z["Id"].split("/")[-1], "name": z["Name"].rstrip("."),
             "callerReference": z["CallerReference"]}
            for z in r53.list_hosted_zones()["HostedZones"]
        ]
    elif command == "certificates":
        acm = boto3.client("acm", endpoint_url=endpoint, region_name="us-east-1")
        out = []
        for summary in acm.list_certificates()["CertificateSummaryList"]:
            arn = summary["CertificateArn"]
            cert = acm.describe_certificate(CertificateArn=arn)["Certificate"]
            tags = acm.list_tags_for_certificate(CertificateArn=arn).get("Tags", [])
            out.append({
                "arn": arn,
                "domain": cert["DomainName"],
                "names": sorted(cert.get("SubjectAlternativeNames", [])),
                "status": cert["Status"],
                "tags": {t["Key"]: t.get("Value") for t in tags},
                "inUseBy": cert.get("InUseBy", []),
            })
        out.sort(key=lambda c: c["arn"])
    elif command == "load-balancer":
        name, cert = args
        elb = boto3.client("elb", endpoint_url=endpoint, region_name="us-east-1")
        elb.create_load_balancer(
            LoadBalancerName=name,
            Listeners=[{"Protocol": "HTTPS", "LoadBalancerPort": 443, "InstanceProtocol": "HTTP",
                        "InstancePort": 80, "SSLCertificateId": cert}],
            AvailabilityZones=["us-east-1a"],
        )
        out = {"name": name}
    elif command == "register-domain":
        name, years = args
        domains = boto3.client("route53domains", endpoint_url=endpoint, region_name="us-east-1")
        contact = {"FirstName": "Other", "LastName": "Owner", "ContactType": "PERSON",
                   "AddressLine1": "1 Elsewhere St", "City": "Springfield", "CountryCode": "US",
                   "ZipCode": "12345", "PhoneNumber": "+1.5555550100", "Email": "other@example.net"}
        op = domains.register_domain(DomainName=name, DurationInYears=int(years),
                                     AdminContact=contact, RegistrantContact=contact,
                                     TechContact=contact)
        out = {"operationId": op["OperationId"]}
    elif command == "domains":
        domains = boto3.client("route53domains", endpoint_url=endpoint, region_name="us-east-1")
        out = sorted(
            ({"name": d["DomainName"], "expiry": int(d["Expiry"].timestamp())}
             for d in domains.list_domains()["Domains"]),
            key=lambda d: d["name"],
        )
    elif command == "name-servers":
        (name,) = args
        domains = boto3.client("route53domains", endpoint_url=endpoint, region_name="us-east-1")
        out = [n["Name"] for n in domains.get_domain_detail(DomainName=name).get("Nameservers", [])]
    elif command == "operations":
        domains = boto3.client("route53domains", endpoint_url=endpoint, region_name="us-east-1")
        out = [
            {"id": o["OperationId"], "type": o["Type"], "status": o["Status"],
             "domain": o.get("DomainName")}
            for o in domains.list_operations()["Operations"]
        ]
    elif command == "distributions":
        cf = boto3.client("cloudfront", endpoint_url=endpoint, region_name="us-east-1")
        out = []
        listing = cf.list_distributions()["DistributionList"]
        for summary in listing.get("Items", []):
            config = cf.get_distribution_config(Id=summary["Id"])["DistributionConfig"]
            origins = config["Origins"]["Items"]
            out.append({
                "id": summary["Id"],
                "aliases": sorted(config.get("Aliases", {}).get("Items", [])),
                "origin": origins[0]["DomainName"] if origins else None,
                "enabled": config["Enabled"],
                "comment": config["Comment"],
                "priceClass": config.get("PriceClass"),
                "cachePolicyId": config["DefaultCacheBehavior"].get("CachePolicyId"),
                "callerReference": config["CallerReference"],
                "certificate": config.get("ViewerCertificate", {}).get("ACMCertificateArn"),
            })
        out.sort(key=lambda d: d["id"])
    elif command == "function":
        name, code = args
        # Before the function exists: moto's Lambda without Docker, whose invocations answer
        # what `invoke-answers` queued.
        config = urllib.request.Request(f"{endpoint}/moto-api/config", method="POST",
                                        data=json.dumps({"lambda": {"use_docker": False}}).encode())
        urllib.request.urlopen(config).read()
        lam = boto3.client("lambda", endpoint_url=endpoint, region_name="us-east-1")
        package = io.BytesIO()
        with zipfile.ZipFile(package, "w") as z:
            z.writestr("handler.py", code)
        try:
            sha = lam.update_function_code(FunctionName=name, ZipFile=package.getvalue())["CodeSha256"]
        except lam.exceptions.ResourceNotFoundException:
            iam = boto3.client("iam", endpoint_url=endpoint, region_name="us-east-1")
            role = iam.create_role(RoleName=f"{name}-role", AssumeRolePolicyDocument=json.dumps({
                "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                "Principal": {"Service": "lambda.amazonaws.com"}}]}))["Role"]["Arn"]
            sha = lam.create_function(FunctionName=name, Runtime="python3.12", Role=role,
                                      Handler="handler.main", Code={"ZipFile": package.getvalue()},
                                      Publish=False)["CodeSha256"]
        out = {"sha": sha, "hex": base64.b64decode(sha).hex()}
    elif command == "publish":
        (name,) = args
        lam = boto3.client("lambda", endpoint_url=endpoint, region_name="us-east-1")
        v = lam.publish_version(FunctionName=name)
        out = {"version": v["Version"], "sha": v["CodeSha256"]}
    elif command == "alias":
        name, alias, version, *canary = args
        lam = boto3.client("lambda", endpoint_url=endpoint, region_name="us-east-1")
        routing = {"AdditionalVersionWeights": {canary[0]: float(canary[1])}} if canary else {}
        try:
            a = lam.update_alias(FunctionName=name, Name=alias, FunctionVersion=version,
                                 RoutingConfig=routing)
        except lam.exceptions.ResourceNotFoundException:
            a = lam.create_alias(FunctionName=name, Name=alias, FunctionVersion=version,
                                 RoutingConfig=routing)
        out = {"version": a["FunctionVersion"]}
    elif command == "lambda":
        (name,) = args
        lam = boto3.client("lambda", endpoint_url=endpoint, region_name="us-east-1")
        versions = [
            {"version": v["Version"], "sha": v["CodeSha256"]}
            for v in lam.list_versions_by_function(FunctionName=name)["Versions"]
            if v["Version"] != "$LATEST"
        ]
        aliases = {
            a["Name"]: {"version": a["FunctionVersion"],
                        "weights": a.get("RoutingConfig", {}).get("AdditionalVersionWeights", {})}
            for a in lam.list_aliases(FunctionName=name)["Aliases"]
        }
        out = {"versions": versions, "aliases": aliases}
    elif command == "invoke-answers":
        answers = urllib.request.Request(
            f"{endpoint}/moto-api/static/lambda-simple/response", method="POST",
            data=json.dumps({"results": list(args), "region": "us-east-1"}).encode())
        urllib.request.urlopen(answers).read()
        out = {}
    else:
        raise SystemExit(f"unknown command {command}")
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
