"""The compose stack's SNS side, run from the eventgate image against an SNS/SQS emulator.

    python -m eventgate_dev.sns_dev init        # FIFO topics + one SQS FIFO queue subscribed
    python -m eventgate_dev.sns_dev subscribe   # print every message that arrives

Endpoint and region come from the SDK variables (``AWS_ENDPOINT_URL``, ``AWS_DEFAULT_REGION``).
``init`` is idempotent (SNS/SQS create calls return the existing resource) and waits for the
emulator to answer.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import boto3
from botocore.exceptions import BotoCoreError, ClientError

TOPICS = ("alerts.fifo", "notifications.fifo")
QUEUE = "eventgate-subscriber.fifo"


def _clients() -> tuple[Any, Any]:
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    return boto3.client("sns", region_name=region), boto3.client("sqs", region_name=region)


def init(*, wait_seconds: float = 60) -> dict[str, str]:
    """Create the topics and the subscribed FIFO queue; returns topic name → ARN."""
    sns, sqs = _clients()
    deadline = time.monotonic() + wait_seconds
    while True:
        try:
            sns.list_topics()
            break
        except (BotoCoreError, ClientError):
            if time.monotonic() > deadline:
                raise
            time.sleep(1)
    queue_url = sqs.create_queue(
        QueueName=QUEUE,
        Attributes={"FifoQueue": "true", "ContentBasedDeduplication": "false"},
    )["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])[
        "Attributes"
    ]["QueueArn"]
    arns: dict[str, str] = {}
    for name in TOPICS:
        arn = sns.create_topic(Name=name, Attributes={"FifoTopic": "true"})["TopicArn"]
        sns.subscribe(
            TopicArn=arn,
            Protocol="sqs",
            Endpoint=queue_arn,
            Attributes={"RawMessageDelivery": "true"},
        )
        arns[name] = arn
        print(f"topic {arn} → {QUEUE}", flush=True)
    return arns


def subscribe(*, once: bool = False) -> list[dict[str, Any]]:
    """Long-poll the subscriber queue and print each message; ``once`` stops after one poll."""
    _, sqs = _clients()
    queue_url = sqs.get_queue_url(QueueName=QUEUE)["QueueUrl"]
    seen: list[dict[str, Any]] = []
    while True:
        reply = sqs.receive_message(
            QueueUrl=queue_url,
            MaxNumberOfMessages=10,
            WaitTimeSeconds=2 if once else 10,
            AttributeNames=["MessageGroupId"],
        )
        for message in reply.get("Messages", []):
            group = message.get("Attributes", {}).get("MessageGroupId")
            print(f"[group {group}] {message['Body']}", flush=True)
            sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"])
            seen.append(message)
        if once:
            return seen


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="SNS/SQS setup and subscriber for compose")
    parser.add_argument("command", choices=["init", "subscribe"])
    args = parser.parse_args(argv)
    if args.command == "init":
        init()
    else:
        subscribe()


if __name__ == "__main__":
    main(sys.argv[1:])
